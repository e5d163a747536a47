// Weights without a shared filesystem ([rl.rollout] weights = "learner"): WeightServer serves a
// learner's WeightStore directory over the actor transport, WeightFetcher copies versions into a
// rollout's own directory in checked chunks, resumes a partial copy, detects damage in transit and
// on disk, and WeightFollower keeps the copy at the newest version from a thread of its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "actors/rl/weight_fetcher.h"
#include "actors/rl/weight_follower.h"
#include "actors/rl/weight_server.h"
#include "actors/runtime/actor.h"
#include "actors/schema/weights.capnp.h"
#include "core/crc32c.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "learner/rl/weight_store.h"

namespace orrery::rl_actors {
namespace {

std::string TempDir(const std::string& name) {
  const std::string dir =
      testing::TempDir() + "/orrery_rl_weights_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A policy version of fresh random weights (about 50 KB: a dozen chunks of 4 KB).
std::vector<std::pair<std::string, Tensor>> RandomWeights(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<std::pair<std::string, Tensor>> named;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"embed.weight", {64, 200}}, {"layers.0.moe.balancing_bias", {7}}, {"norm", {33}}}) {
    Tensor t = Tensor::Empty(shape, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
    named.emplace_back(name, std::move(t));
  }
  return named;
}

// A learner's weight directory served at an inproc endpoint.
class ServedLearner {
 public:
  explicit ServedLearner(const std::string& name)
      : dir_(TempDir(name + "_learner")),
        endpoint_("inproc://weights-" + name),
        store_(dir_, 3),
        server_(dir_),
        actor_(zmq_, "learner:0") {
    bound_ = actor_.Bind(endpoint_);
    server_.Register(actor_);
    if (bound_.ok()) thread_ = std::thread([this] { (void)actor_.Run(stop_); });
  }
  ~ServedLearner() {
    stop_.Cancel();
    if (thread_.joinable()) thread_.join();
    std::filesystem::remove_all(dir_);
  }
  Status bound() const { return bound_; }
  void Publish(int64_t version) {
    ASSERT_TRUE(store_.Publish(RandomWeights(version), version).ok());
  }
  std::string FileOf(int64_t version) const { return *ReadFileToString(store_.PathOf(version)); }
  zmq::context_t& zmq() { return zmq_; }
  Actor& actor() { return actor_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string endpoint_;
  zmq::context_t zmq_;
  rl::WeightStore store_;
  WeightServer server_;
  Actor actor_;
  Status bound_;
  Cancellation stop_;
  std::thread thread_;
};

WeightFetchOptions SmallChunks(const std::string& dir) {
  WeightFetchOptions o;
  o.dir = dir;
  o.chunk_bytes = 4096;
  o.keep = 2;
  o.call_timeout = std::chrono::milliseconds(5000);
  return o;
}

TEST(WeightFetcherTest, CopiesTheNewestVersionIntoAnotherDirectoryExactly) {
  ServedLearner learner("copy");
  ASSERT_TRUE(learner.bound().ok()) << learner.bound().ToString();
  const std::string local = TempDir("copy_rollout");
  WeightFetcher fetcher(learner.zmq(), "rollout:0", SmallChunks(local));
  ASSERT_TRUE(fetcher.Connect(learner.endpoint()).ok());

  // Nothing published yet: nothing fetched, no error.
  auto none = fetcher.FetchNewest(-1, nullptr);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->version, -1);

  learner.Publish(0);
  learner.Publish(1);
  auto got = fetcher.FetchNewest(-1, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->version, 1);
  const std::string want = learner.FileOf(1);
  EXPECT_EQ(got->bytes, static_cast<int64_t>(want.size()));
  EXPECT_EQ(got->bytes_fetched, got->bytes);
  EXPECT_GT(got->bytes, 10 * 4096) << "the copy should take many chunks";
  rl::WeightStore copy(local, 2);
  EXPECT_EQ(*ReadFileToString(copy.PathOf(1)), want);
  auto loaded = copy.Load(1);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const auto original = RandomWeights(1);
  ASSERT_EQ(loaded->size(), original.size());
  for (size_t i = 0; i < original.size(); ++i) {
    ASSERT_EQ(original[i].second.nbytes(), (*loaded)[i].second.nbytes());
    EXPECT_EQ(std::memcmp(original[i].second.data<uint8_t>(), (*loaded)[i].second.data<uint8_t>(),
                          original[i].second.nbytes()),
              0)
        << original[i].first;
  }
  // Up to date: nothing to do. Newer ones replace older ones beyond `keep` (2).
  EXPECT_EQ(fetcher.FetchNewest(1, nullptr)->version, -1);
  for (int64_t v = 2; v <= 3; ++v) {
    learner.Publish(v);
    ASSERT_EQ(fetcher.FetchNewest(v - 1, nullptr)->version, v);
  }
  EXPECT_FALSE(std::filesystem::exists(copy.PathOf(1)));
  EXPECT_TRUE(std::filesystem::exists(copy.PathOf(2)));
  EXPECT_EQ(*copy.Latest(), 3);
  std::filesystem::remove_all(local);
}

TEST(WeightFetcherTest, ResumesAnInterruptedCopyAndRefetchesADamagedOne) {
  ServedLearner learner("resume");
  ASSERT_TRUE(learner.bound().ok());
  learner.Publish(4);
  const std::string want = learner.FileOf(4);
  const std::string local = TempDir("resume_rollout");
  rl::WeightStore copy(local, 2);
  const std::string part = copy.PathOf(4) + ".part";
  WeightFetcher fetcher(learner.zmq(), "rollout:0", SmallChunks(local));
  ASSERT_TRUE(fetcher.Connect(learner.endpoint()).ok());

  // 40% arrived before the rollout died: only the rest moves.
  const size_t cut = want.size() * 2 / 5;
  ASSERT_TRUE(WriteFileAtomic(part, want.substr(0, cut)).ok());
  auto got = fetcher.FetchNewest(-1, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->resumed_at, static_cast<int64_t>(cut));
  EXPECT_EQ(got->bytes_fetched, static_cast<int64_t>(want.size() - cut));
  EXPECT_FALSE(got->restarted);
  EXPECT_EQ(*ReadFileToString(copy.PathOf(4)), want);
  EXPECT_FALSE(std::filesystem::exists(part));

  // A part whose bytes were damaged on disk: the whole file's CRC refuses it, the copy starts
  // over once, and what lands in place is the learner's file.
  std::filesystem::remove(copy.PathOf(4));
  std::string damaged = want.substr(0, cut);
  damaged[cut / 2] ^= 0x5A;
  ASSERT_TRUE(WriteFileAtomic(part, damaged).ok());
  got = fetcher.FetchNewest(-1, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->restarted);
  EXPECT_EQ(got->bytes_fetched, static_cast<int64_t>(want.size()));
  EXPECT_EQ(*ReadFileToString(copy.PathOf(4)), want);

  // A part of a version the learner no longer serves is deleted, not resumed into another one.
  std::filesystem::remove(copy.PathOf(4));
  const std::string old_part = copy.PathOf(2) + ".part";
  ASSERT_TRUE(WriteFileAtomic(old_part, want.substr(0, 100)).ok());
  got = fetcher.FetchNewest(-1, nullptr);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->resumed_at, 0);
  EXPECT_FALSE(std::filesystem::exists(old_part));
  EXPECT_EQ(*ReadFileToString(copy.PathOf(4)), want);
  std::filesystem::remove_all(local);
}

// A chunk damaged in transit (its bytes do not match the CRC sent with them) is read again; one
// that never arrives whole fails the fetch with DataLoss and leaves no version in place.
TEST(WeightFetcherTest, AChunkDamagedInTransitIsReadAgain) {
  ServedLearner learner("transit");
  ASSERT_TRUE(learner.bound().ok());
  learner.Publish(1);
  const std::string file = learner.FileOf(1);
  int damaged_left = 1;
  // Replaces the server's Read: the right CRC with flipped bytes, `damaged_left` times.
  learner.actor().Handle<schema::WeightsReadRequest, schema::WeightsReadReply>(
      "weights.Read",
      [&](schema::WeightsReadRequest::Reader req, schema::WeightsReadReply::Builder rep) {
        const size_t off = static_cast<size_t>(req.getOffset());
        const size_t n = std::min<size_t>(static_cast<size_t>(req.getLength()), file.size() - off);
        std::string bytes = file.substr(off, n);
        rep.setCrc32(Crc32c(0, bytes.data(), bytes.size()));
        if (damaged_left != 0 && off > 0) {
          if (damaged_left > 0) --damaged_left;
          bytes[n / 2] ^= 1;
        }
        rep.setData(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(bytes.data()), n));
        return Status::OK();
      });
  const std::string local = TempDir("transit_rollout");
  WeightFetcher fetcher(learner.zmq(), "rollout:0", SmallChunks(local));
  ASSERT_TRUE(fetcher.Connect(learner.endpoint()).ok());
  auto got = fetcher.FetchNewest(-1, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->chunk_retries, 1);
  rl::WeightStore copy(local, 2);
  EXPECT_EQ(*ReadFileToString(copy.PathOf(1)), file);

  std::filesystem::remove(copy.PathOf(1));
  damaged_left = -1;  // always
  got = fetcher.FetchNewest(-1, nullptr);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss) << got.status().ToString();
  EXPECT_NE(got.status().message().find("CRC-32C"), std::string::npos) << got.status().message();
  EXPECT_FALSE(copy.Latest().ok());
  std::filesystem::remove_all(local);
}

// What a stranger may ask is bounded: a number, not a path; a range inside the file.
TEST(WeightServerTest, RefusesRangesOutsideTheFileAndUnknownVersions) {
  ServedLearner learner("ranges");
  ASSERT_TRUE(learner.bound().ok());
  learner.Publish(1);
  const int64_t size = static_cast<int64_t>(learner.FileOf(1).size());
  ActorClient client(learner.zmq(), "stranger");
  ASSERT_TRUE(client.Connect(learner.endpoint()).ok());
  auto read = [&](int64_t version, int64_t offset, int64_t length) {
    return client
        .Call<schema::WeightsReadRequest, schema::WeightsReadReply>(
            "weights.Read",
            [&](schema::WeightsReadRequest::Builder r) {
              r.setVersion(version);
              r.setOffset(offset);
              r.setLength(length);
            })
        .status();
  };
  EXPECT_TRUE(read(1, 0, 100).ok());
  EXPECT_TRUE(read(1, size - 1, 100).ok());  // the last chunk may be short
  EXPECT_EQ(read(1, size, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(read(1, -1, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(read(1, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(read(1, 0, WeightServer::kDefaultMaxChunkBytes + 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(read(-3, 0, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(read(2, 0, 1).code(), StatusCode::kNotFound);
  auto info = client.Call<schema::WeightsInfoRequest, schema::WeightsInfoReply>(
      "weights.Info", [](schema::WeightsInfoRequest::Builder) {});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->get().getVersion(), 1);
  EXPECT_EQ(info->get().getBytes(), size);
  const std::string file = learner.FileOf(1);
  EXPECT_EQ(info->get().getCrc32(), Crc32c(0, file.data(), file.size()));
}

// The follower keeps up with new versions from its own thread; an unreachable learner is not an
// error (it may be restarting), only a reason to try again.
TEST(WeightFollowerTest, FollowsNewVersionsAndWaitsOutAnUnreachableLearner) {
  ServedLearner learner("follow");
  ASSERT_TRUE(learner.bound().ok());
  const std::string local = TempDir("follow_rollout");
  rl::WeightStore copy(local, 2);
  auto wait_for = [&](int64_t version) {
    for (int i = 0; i < 500; ++i) {
      StatusOr<int64_t> v = copy.Latest();
      if (v.ok() && *v >= version) return *v;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return int64_t{-1};
  };
  {
    WeightFollower follower(learner.zmq(), "rollout:0", SmallChunks(local), learner.endpoint(),
                            std::chrono::milliseconds(10));
    ASSERT_TRUE(follower.Start().ok());
    learner.Publish(1);
    EXPECT_EQ(wait_for(1), 1);
    learner.Publish(2);
    EXPECT_EQ(wait_for(2), 2);
    EXPECT_TRUE(follower.status().ok()) << follower.status().ToString();
    // Both fetches are reported, once each, in order, though version 2 is already on disk: the
    // rollout reports every fetch, not only one matching the version it loads.
    std::vector<int64_t> reported;
    for (int i = 0; i < 500 && reported.size() < 2; ++i) {
      for (const FetchStats& f : follower.TakeFetched()) {
        reported.push_back(f.version);
        EXPECT_GT(f.bytes_fetched, 0);
      }
      if (reported.size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(reported, (std::vector<int64_t>{1, 2}));
    EXPECT_TRUE(follower.TakeFetched().empty()) << "each fetch is handed out once";
    EXPECT_EQ(*ReadFileToString(copy.PathOf(2)), learner.FileOf(2));
  }
  WeightFetchOptions o = SmallChunks(TempDir("follow_nobody"));
  o.call_timeout = std::chrono::milliseconds(50);
  WeightFollower lonely(learner.zmq(), "rollout:1", o, "inproc://nobody-serves-this",
                        std::chrono::milliseconds(10));
  ASSERT_TRUE(lonely.Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(lonely.status().ok()) << lonely.status().ToString();
  EXPECT_TRUE(lonely.TakeFetched().empty());
  EXPECT_GE(lonely.rounds(), 1) << "a round that reached nobody still counts (startup waits on it)";
  std::filesystem::remove_all(local);
  std::filesystem::remove_all(o.dir);
}

}  // namespace
}  // namespace orrery::rl_actors
