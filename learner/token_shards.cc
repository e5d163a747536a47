#include "learner/token_shards.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace orrery {
namespace {

std::string ShardName(int32_t index) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05d.safetensors", index);
  return buf;
}

Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("create directory " + dir + ": " + ec.message());
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<TokenShardWriter>> TokenShardWriter::Create(
    TokenShardWriterOptions options) {
  if (options.dir.empty())
    return InvalidArgumentError("token shard writer: empty output directory");
  if (options.vocab_size <= 0)
    return InvalidArgumentError("token shard writer: vocab_size must be > 0");
  if (options.shard_tokens <= 0)
    return InvalidArgumentError("token shard writer: shard_tokens must be > 0");
  ORRERY_RETURN_IF_ERROR(MakeDirs(options.dir));
  return std::unique_ptr<TokenShardWriter>(new TokenShardWriter(std::move(options)));
}

Status TokenShardWriter::Add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& loss_mask,
                             DocumentKind kind, bool heldout) {
  if (ids.empty()) return InvalidArgumentError("token shard writer: empty document");
  if (ids.size() != loss_mask.size()) {
    return InvalidArgumentError("token shard writer: ids and loss mask differ in length");
  }
  for (int32_t id : ids) {
    if (id < 0 || id >= options_.vocab_size) {
      return OutOfRangeError("token shard writer: id " + std::to_string(id) +
                             " outside the vocabulary of " + std::to_string(options_.vocab_size));
    }
  }
  if (!tokens_.empty() &&
      static_cast<int64_t>(tokens_.size() + ids.size()) > options_.shard_tokens) {
    ORRERY_RETURN_IF_ERROR(FlushShard());
  }
  doc_shard_.push_back(shard_index_);
  doc_offset_.push_back(static_cast<int64_t>(tokens_.size()));
  doc_length_.push_back(static_cast<int64_t>(ids.size()));
  doc_heldout_.push_back(heldout ? 1 : 0);
  doc_kind_.push_back(static_cast<uint8_t>(kind));
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  mask_.insert(mask_.end(), loss_mask.begin(), loss_mask.end());
  total_tokens_ += static_cast<int64_t>(ids.size());
  return Status::OK();
}

Status TokenShardWriter::FlushShard() {
  const int64_t n = static_cast<int64_t>(tokens_.size());
  ORRERY_RETURN_IF_ERROR(
      WriteSafetensors(options_.dir + "/" + ShardName(shard_index_),
                       {{"tokens", Tensor::FromVector<int32_t>({n}, tokens_)},
                        {"loss_mask", Tensor::FromVector<uint8_t>({n}, mask_)}}));
  tokens_.clear();
  mask_.clear();
  ++shard_index_;
  return Status::OK();
}

Status TokenShardWriter::Finish() {
  if (doc_shard_.empty()) return InvalidArgumentError("token shard writer: no documents");
  if (!tokens_.empty()) ORRERY_RETURN_IF_ERROR(FlushShard());
  const int64_t d = num_documents();
  int64_t heldout = 0;
  for (uint8_t h : doc_heldout_) heldout += h;
  return WriteSafetensors(options_.dir + "/index.safetensors",
                          {{"shard", Tensor::FromVector<int32_t>({d}, doc_shard_)},
                           {"offset", Tensor::FromVector<int64_t>({d}, doc_offset_)},
                           {"length", Tensor::FromVector<int64_t>({d}, doc_length_)},
                           {"heldout", Tensor::FromVector<uint8_t>({d}, doc_heldout_)},
                           {"kind", Tensor::FromVector<uint8_t>({d}, doc_kind_)}},
                          {{"format", "orrery-token-shards-v1"},
                           {"vocab_size", std::to_string(options_.vocab_size)},
                           {"tokenizer", options_.tokenizer_name},
                           {"num_shards", std::to_string(shard_index_)},
                           {"num_documents", std::to_string(d)},
                           {"num_heldout_documents", std::to_string(heldout)},
                           {"num_tokens", std::to_string(total_tokens_)}});
}

StatusOr<TokenDataset> TokenDataset::Open(const std::string& dir) {
  const std::string index_path = dir + "/index.safetensors";
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return NotFoundError("data directory " + dir + " does not exist (run `orrery data prepare`)");
  }
  if (::stat(index_path.c_str(), &st) != 0) {
    return NotFoundError(index_path + " is missing: not a prepared data directory");
  }
  ORRERY_ASSIGN_OR_RETURN(SafetensorsFile index, SafetensorsFile::Open(index_path));
  auto corrupt = [&](const std::string& what) { return DataLossError(index_path + ": " + what); };
  const auto& meta = index.metadata();
  if (!meta.count("format") || meta.at("format") != "orrery-token-shards-v1") {
    return corrupt("not an Orrery token index (metadata format != orrery-token-shards-v1)");
  }
  TokenDataset ds;
  ds.dir_ = dir;
  int64_t num_shards = 0;
  try {
    ds.vocab_size_ = std::stoll(meta.at("vocab_size"));
    num_shards = std::stoll(meta.at("num_shards"));
  } catch (const std::exception&) {
    return corrupt("metadata lacks a numeric vocab_size or num_shards");
  }
  auto column = [&](const char* name, DType dtype, int64_t* n) -> StatusOr<Tensor> {
    ORRERY_ASSIGN_OR_RETURN(Tensor t, index.Get(name));
    if (t.dtype() != dtype || t.ndim() != 1) return corrupt(std::string("bad column ") + name);
    if (*n >= 0 && t.dim(0) != *n)
      return corrupt(std::string("column ") + name + " has a different length");
    *n = t.dim(0);
    return t;
  };
  int64_t d = -1;
  ORRERY_ASSIGN_OR_RETURN(Tensor shard, column("shard", DType::kI32, &d));
  ORRERY_ASSIGN_OR_RETURN(Tensor offset, column("offset", DType::kI64, &d));
  ORRERY_ASSIGN_OR_RETURN(Tensor length, column("length", DType::kI64, &d));
  ORRERY_ASSIGN_OR_RETURN(Tensor heldout, column("heldout", DType::kU8, &d));
  ORRERY_ASSIGN_OR_RETURN(Tensor kind, column("kind", DType::kU8, &d));
  ds.shard_.assign(shard.data<int32_t>(), shard.data<int32_t>() + d);
  ds.offset_.assign(offset.data<int64_t>(), offset.data<int64_t>() + d);
  ds.length_.assign(length.data<int64_t>(), length.data<int64_t>() + d);
  ds.heldout_.assign(heldout.data<uint8_t>(), heldout.data<uint8_t>() + d);
  ds.kind_.assign(kind.data<uint8_t>(), kind.data<uint8_t>() + d);

  std::vector<int64_t> shard_len;
  for (int64_t s = 0; s < num_shards; ++s) {
    ORRERY_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(dir + "/" + ShardName(s)));
    ORRERY_ASSIGN_OR_RETURN(Tensor tokens, f.Get("tokens"));
    ORRERY_ASSIGN_OR_RETURN(Tensor mask, f.Get("loss_mask"));
    if (tokens.dtype() != DType::kI32 || mask.dtype() != DType::kU8 || tokens.ndim() != 1 ||
        mask.ndim() != 1 || tokens.dim(0) != mask.dim(0)) {
      return DataLossError(f.path() + ": expected tokens i32 [N] and loss_mask u8 [N]");
    }
    const int32_t* ids = tokens.data<int32_t>();
    for (int64_t i = 0; i < tokens.dim(0); ++i) {
      if (ids[i] < 0 || ids[i] >= ds.vocab_size_) {
        return DataLossError(f.path() + ": token " + std::to_string(i) + " has id " +
                             std::to_string(ids[i]) + ", outside the vocabulary of " +
                             std::to_string(ds.vocab_size_));
      }
    }
    shard_len.push_back(tokens.dim(0));
    ds.shard_ids_.push_back(ids);
    ds.shard_mask_.push_back(mask.data<uint8_t>());
    ds.shards_.push_back(std::move(f));
  }
  for (int64_t i = 0; i < d; ++i) {
    const int32_t s = ds.shard_[i];
    if (s < 0 || s >= num_shards || ds.offset_[i] < 0 || ds.length_[i] <= 0 ||
        ds.offset_[i] + ds.length_[i] > shard_len[s]) {
      return corrupt("document " + std::to_string(i) + " lies outside its shard");
    }
    ds.num_tokens_ += ds.length_[i];
  }
  return ds;
}

DocumentView TokenDataset::document(int64_t i) const {
  const int32_t s = shard_[i];
  return DocumentView{shard_ids_[s] + offset_[i], shard_mask_[s] + offset_[i], length_[i]};
}

std::vector<int64_t> TokenDataset::DocumentsInSplit(bool heldout) const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < num_documents(); ++i) {
    if ((heldout_[i] != 0) == heldout) out.push_back(i);
  }
  return out;
}

}  // namespace orrery
