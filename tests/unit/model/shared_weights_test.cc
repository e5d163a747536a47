// Shared weights (model/shared_weights.h, core/shared_buffer.h) on the CPU: the layout and its
// text, the buffer handles and what is refused, the publisher's two buffers and leases (a rewrite
// waits for a live lease, not for an expired one, and an expired lease reports its copy as not
// whole), and the two-process check of tests/gpu/shared_weights_check.h over a memfd: a rollout
// process's GpuModel (on the ops' CPU twins) equals the learner's version bit for bit.
#include "model/shared_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/shared_buffer.h"
#include "tests/gpu/shared_weights_check.h"

namespace orrery::model {
namespace {

NamedTensors Named(std::initializer_list<std::pair<std::string, Shape>> shapes) {
  NamedTensors out;
  float x = 1;
  for (const auto& [name, shape] : shapes) {
    Tensor t = Tensor::Empty(shape, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = x++;
    out.emplace_back(name, std::move(t));
  }
  return out;
}

TEST(SharedWeightLayoutTest, OffsetsAreAlignedAndTheTextRoundTrips) {
  const NamedTensors named = Named({{"a", {3}}, {"b.c", {2, 70}}, {"d", {1}}});
  StatusOr<SharedWeightLayout> l = SharedWeightLayout::Of(named);
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->entries().size(), 3u);
  EXPECT_EQ(l->entries()[0].offset, 0);
  EXPECT_EQ(l->entries()[1].offset, 256);
  EXPECT_EQ(l->entries()[1].bytes, 560);
  EXPECT_EQ(l->entries()[2].offset, 256 + 768);
  EXPECT_EQ(l->total_bytes(), 256 + 768 + 256);
  StatusOr<SharedWeightLayout> back = SharedWeightLayout::Parse(l->Serialize());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->Serialize(), l->Serialize());
  EXPECT_EQ(back->total_bytes(), l->total_bytes());
  EXPECT_TRUE(back->Matches(named).ok());
}

TEST(SharedWeightLayoutTest, MismatchesAreOneLineNamingTheTensor) {
  const SharedWeightLayout l = SharedWeightLayout::Of(Named({{"a", {3}}, {"b", {2, 2}}})).value();
  Status s = l.Matches(Named({{"a", {3}}}));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s.message();
  s = l.Matches(Named({{"a", {3}}, {"b", {4}}}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s.message();
  s = l.Matches(Named({{"a", {3}}, {"b", {2, 2}}, {"extra", {1}}}));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'extra'"), std::string::npos) << s.message();
  EXPECT_FALSE(SharedWeightLayout::Of(Named({{"a b", {1}}})).ok());
  EXPECT_FALSE(SharedWeightLayout::Of(Named({{"a", {1}}, {"a", {1}}})).ok());
  EXPECT_FALSE(SharedWeightLayout::Parse("a f32 3 0\nb f32 2,2 16\n").ok()) << "bad offset";
  EXPECT_FALSE(SharedWeightLayout::Parse("a f32 3\n").ok());
  EXPECT_FALSE(SharedWeightLayout::Parse("a f32 3 0\na f32 3 256\n").ok());
  EXPECT_FALSE(SharedWeightLayout::Parse("").ok());
}

TEST(SharedBufferTest, AHandleMapsTheSameBytesAndBadOnesAreRefused) {
  StatusOr<std::unique_ptr<SharedBuffer>> b = SharedBuffer::Create(Device::Cpu(), 1000);
  ASSERT_TRUE(b.ok()) << b.status().message();
  std::memcpy((*b)->data(), "orrery", 6);
  StatusOr<std::unique_ptr<SharedBufferMapping>> m = SharedBufferMapping::Open((*b)->handle());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->bytes(), 1000u);
  EXPECT_EQ(std::memcmp((*m)->data(), "orrery", 6), 0);
  // The same descriptor with another nonce: a buffer that is no longer the handle's.
  std::string other = (*b)->handle();
  other.replace(other.size() - 16, 16, "0123456789abcdef");
  EXPECT_EQ(SharedBufferMapping::Open(other).status().code(), StatusCode::kNotFound);
  for (const std::string& bad :
       {std::string("cpu/1/2/3"), std::string("gpu/0/8/00"), std::string("cuda/0/8/zz"),
        std::string("cpu/x/3/10/0123456789abcdef"), std::string("")}) {
    EXPECT_EQ(SharedBufferMapping::Open(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // More bytes than the memfd holds.
  std::string larger = (*b)->handle();
  const size_t at = larger.find("/1000/");
  larger.replace(at, 6, "/4096/");
  EXPECT_FALSE(SharedBufferMapping::Open(larger).ok());
  EXPECT_FALSE(SharedBuffer::Create(Device::Cpu(), 0).ok());
}

TEST(SharedWeightPublisherTest, VersionsAlternateAndLeasesHoldARewrite) {
  const NamedTensors v1 = Named({{"w", {64}}, {"b", {3}}});
  SharedWeightPublisher::Options o;
  o.lease_ttl = std::chrono::seconds(30);
  auto p = SharedWeightPublisher::Create(v1, Device::Cpu(), o).value();
  EXPECT_EQ(p->Acquire(-1).version, -1) << "nothing published yet";
  ASSERT_TRUE(p->Publish(v1, 1, 10.0).ok());
  const SharedWeightGrant g1 = p->Acquire(0);
  ASSERT_EQ(g1.version, 1);
  EXPECT_EQ(g1.published_at, 10.0);
  EXPECT_EQ(p->Acquire(1).version, -1) << "not newer than the reader's";
  // Version 2 goes to the other buffer: no wait for the lease on the first.
  ASSERT_TRUE(p->Publish(v1, 2, 11.0).ok());
  const SharedWeightGrant g2 = p->Acquire(1);
  ASSERT_EQ(g2.version, 2);
  EXPECT_NE(g2.handle, g1.handle);
  EXPECT_TRUE(p->Release(g2.lease));
  // Version 3 rewrites version 1's buffer: it waits for g1's release.
  std::atomic<bool> done{false};
  std::thread writer([&] {
    EXPECT_TRUE(p->Publish(v1, 3, 12.0).ok());
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done) << "rewrote a buffer under a live lease";
  EXPECT_EQ(p->newest_version(), 2);
  EXPECT_TRUE(p->Release(g1.lease)) << "the lease was live: the copy is whole";
  writer.join();
  EXPECT_TRUE(done);
  EXPECT_EQ(p->newest_version(), 3);
  const SharedWeightGrant g3 = p->Acquire(2);
  EXPECT_EQ(g3.handle, g1.handle);
  EXPECT_TRUE(p->Release(g3.lease));
  EXPECT_FALSE(p->Release(g3.lease)) << "released twice";
  EXPECT_FALSE(p->Release(12345)) << "never granted";
  EXPECT_EQ(p->live_leases(), 0);
}

TEST(SharedWeightPublisherTest, AnExpiredLeaseNeitherHoldsTheWriterNorCountsAsWhole) {
  const NamedTensors v = Named({{"w", {8}}});
  SharedWeightPublisher::Options o;
  o.lease_ttl = std::chrono::milliseconds(300);
  auto p = SharedWeightPublisher::Create(v, Device::Cpu(), o).value();
  ASSERT_TRUE(p->Publish(v, 1, 0).ok());
  const SharedWeightGrant stalled = p->Acquire(0);  // a reader that never releases
  ASSERT_TRUE(p->Publish(v, 2, 0).ok());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(p->Publish(v, 3, 0).ok());  // rewrites the stalled reader's buffer after its TTL
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 5.0);
  EXPECT_FALSE(p->Release(stalled.lease)) << "its buffer may have been rewritten";
}

TEST(SharedWeightReaderTest, CopiesEachTensorToItsTarget) {
  const NamedTensors v = Named({{"w", {5, 7}}, {"b", {3}}});
  auto p = SharedWeightPublisher::Create(v, Device::Cpu()).value();
  ASSERT_TRUE(p->Publish(v, 1, 0).ok());
  const SharedWeightGrant g = p->Acquire(0);
  NamedTensors targets = {{"b", Tensor::Zeros({3}, DType::kF32)},
                          {"w", Tensor::Zeros({5, 7}, DType::kF32)}};
  SharedWeightReader reader;
  ASSERT_TRUE(reader.CopyInto(g.handle, p->layout(), targets).ok());
  EXPECT_EQ(shared_check::FirstDifference(targets, v), "");
  NamedTensors wrong = {{"w", Tensor::Zeros({5, 7}, DType::kF32)}};
  EXPECT_EQ(reader.CopyInto(g.handle, p->layout(), wrong).status().code(), StatusCode::kNotFound);
}

// The learner (this process) and a rollout (a second process): every tensor bit for bit.
TEST(SharedWeightsTest, ARolloutProcessCopiesEachVersionBitForBit) {
  shared_check::RunParent(Device::Cpu(), "SharedWeightsChild.*");
}

TEST(SharedWeightsChild, CopiesTheVersionItIsHanded) {
  const char* control = std::getenv(shared_check::kChildVariable);
  if (control == nullptr) GTEST_SKIP() << "the child of SharedWeightsTest (run by it)";
  shared_check::RunChild(control, Device::Cpu());
}

}  // namespace
}  // namespace orrery::model
