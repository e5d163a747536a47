// Record encodings: a payload written by PutPayload (hand-framed segments) decodes with
// DecodePayload to the same trajectories, for empty, small, odd-sized and large ones.
#include "actors/replay/records.h"

#include <gtest/gtest.h>
#include <rocksdb/write_batch.h>

namespace orrery::replay {
namespace {

class CapturePut : public rocksdb::WriteBatch::Handler {
 public:
  rocksdb::Status PutCF(uint32_t, const rocksdb::Slice& key, const rocksdb::Slice& value) override {
    key_ = key.ToString();
    value_ = value.ToString();
    return rocksdb::Status::OK();
  }
  std::string key_, value_;
};

TEST(RecordsTest, PutPayloadRoundTrips) {
  const std::vector<std::vector<std::string>> cases = {
      {}, {""}, {"a"}, {"abcdefg", "", std::string(13, 'x')}, {std::string(1 << 20, 'z'), "end"}};
  for (const auto& trajectories : cases) {
    rocksdb::WriteBatch batch;
    PutPayload(&batch, "d/t/key", trajectories);
    CapturePut capture;
    ASSERT_TRUE(batch.Iterate(&capture).ok());
    EXPECT_EQ(capture.key_, "d/t/key");
    StatusOr<std::vector<std::string>> decoded = DecodePayload(capture.value_);
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    EXPECT_EQ(*decoded, trajectories);
  }
}

}  // namespace
}  // namespace orrery::replay
