#include "core/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace orrery {
namespace {

class SafetensorsTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("orrery_st_" + std::to_string(::getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }
  // Writes a file with the given header JSON and `data_bytes` bytes of data.
  std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                       int64_t claimed_len = -1) {
    std::string s;
    uint64_t n = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : header.size();
    for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    s += header;
    s += std::string(data_bytes, '\0');
    std::ofstream(Path(name), std::ios::binary) << s;
    return Path(name);
  }
  std::filesystem::path dir_;
};

TEST_F(SafetensorsTest, RoundTripEveryDType) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.emplace_back("f32", Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4}));
  tensors.emplace_back("f64", Tensor::FromVector<double>({1}, {0.5}));
  tensors.emplace_back("bf16", *Tensor::FromVector<float>({3}, {1, -2, 3.5}).Cast(DType::kBF16));
  tensors.emplace_back("f16", *Tensor::FromVector<float>({1}, {0.25f}).Cast(DType::kF16));
  tensors.emplace_back("i32", Tensor::FromVector<int32_t>({2}, {-7, 9}));
  tensors.emplace_back("i64", Tensor::FromVector<int64_t>({1}, {int64_t{1} << 40}));
  tensors.emplace_back("u8", Tensor::FromVector<uint8_t>({3}, {0, 128, 255}));
  tensors.emplace_back("bool", Tensor::FromVector<bool>({2}, {true, false}));
  tensors.emplace_back("empty", Tensor::Zeros({0, 4}, DType::kF32));
  ASSERT_TRUE(WriteSafetensors(Path("a.safetensors"), tensors, {{"step", "12"}}).ok());
  StatusOr<SafetensorsFile> f = SafetensorsFile::Open(Path("a.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->names().size(), tensors.size());
  EXPECT_EQ(f->metadata().at("step"), "12");
  for (const auto& [name, t] : tensors) {
    Tensor r = *f->Get(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(r.raw_data(), t.raw_data(), t.nbytes()), 0) << name;
  }
  // Writing to a loaded tensor does not change the file (copy-on-write mapping).
  f->Get("f32")->data<float>()[0] = 99;
  StatusOr<SafetensorsFile> again = SafetensorsFile::Open(Path("a.safetensors"));
  EXPECT_EQ(again->Get("f32")->data<float>()[0], 1);
  EXPECT_EQ(f->Get("missing").status().code(), StatusCode::kNotFound);
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST_F(SafetensorsTest, RejectsLyingHeaders) {
  auto expect_corrupt = [&](const std::string& path, const std::string& fragment) {
    StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << path;
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(f.status().message().find(fragment), std::string::npos) << f.status().message();
  };
  std::ofstream(Path("short")) << "abc";
  expect_corrupt(Path("short"), "shorter than the 8-byte header length");
  expect_corrupt(WriteRaw("len", "{}", 0, 1000), "header length 1000 exceeds the file");
  expect_corrupt(WriteRaw("json", "{not json", 0), "header is not a JSON object");
  expect_corrupt(WriteRaw("dtype", R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1),
                 "unsupported safetensors dtype 'F8'");
  expect_corrupt(WriteRaw("size", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
                 "holds 4 bytes but its shape and dtype need 8");
  expect_corrupt(WriteRaw("oob", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
                 "outside the 4-byte data buffer");
  expect_corrupt(WriteRaw("overlap",
                          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          8),
                 "overlapping");
  expect_corrupt(WriteRaw("hole", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4),
                 "leaving a hole");
  expect_corrupt(WriteRaw("trail", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 4),
                 "trailing bytes");
  expect_corrupt(WriteRaw("neg", R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2),
                 "negative dimension");
  // A truncated real file.
  ASSERT_TRUE(WriteSafetensors(Path("t"), {{"x", Tensor::Zeros({100}, DType::kF32)}}).ok());
  std::filesystem::resize_file(Path("t"), std::filesystem::file_size(Path("t")) - 10);
  expect_corrupt(Path("t"), "outside");
  EXPECT_EQ(SafetensorsFile::Open(Path("nope")).status().code(), StatusCode::kIoError);
}

TEST_F(SafetensorsTest, WriteRejectsBadInput) {
  EXPECT_FALSE(
      WriteSafetensors(Path("x"), {{"__metadata__", Tensor::Zeros({1}, DType::kF32)}}).ok());
  EXPECT_FALSE(WriteSafetensors(Path("x"), {{"a", Tensor()}}).ok());
  EXPECT_FALSE(WriteSafetensors(Path("x"), {{"a", Tensor::Zeros({1}, DType::kF32)},
                                            {"a", Tensor::Zeros({1}, DType::kF32)}})
                   .ok());
  EXPECT_FALSE(WriteSafetensors("/nonexistent/dir/x", {}).ok());
}

}  // namespace
}  // namespace orrery
