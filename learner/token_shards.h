// Token shards: the on-disk form of a tokenized corpus, with a document index.
//
// A data directory holds
//   shard-00000.safetensors ...  "tokens" i32 [N] and "loss_mask" u8 [N] (1: a training target)
//   index.safetensors            per document: "shard" i32, "offset" i64, "length" i64,
//                                "heldout" u8 (1: reserved for evaluation), "kind" u8 (0 text,
//                                1 chat); metadata: vocab_size, tokenizer (file name), counts
// Documents never straddle shards. Everything is written through core/safetensors.h, so a
// truncated or corrupt file is refused when opened, and each file is replaced atomically.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"

namespace orrery {

enum class DocumentKind : uint8_t { kText = 0, kChat = 1 };

struct TokenShardWriterOptions {
  std::string dir;                  // created if missing
  int64_t shard_tokens = 16 << 20;  // a shard is closed once it holds this many tokens
  int64_t vocab_size = 0;           // recorded; every id must be below it
  std::string tokenizer_name;       // recorded for provenance
};

class TokenShardWriter {
 public:
  static StatusOr<std::unique_ptr<TokenShardWriter>> Create(TokenShardWriterOptions options);
  // Appends one document. ids and loss_mask have equal, non-zero length.
  Status Add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& loss_mask,
             DocumentKind kind, bool heldout);
  // Writes the last shard and the index. Nothing is readable before Finish.
  Status Finish();

  int64_t num_documents() const { return static_cast<int64_t>(doc_shard_.size()); }
  int64_t num_tokens() const { return total_tokens_; }

 private:
  explicit TokenShardWriter(TokenShardWriterOptions options) : options_(std::move(options)) {}
  Status FlushShard();

  TokenShardWriterOptions options_;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> mask_;
  int32_t shard_index_ = 0;
  int64_t total_tokens_ = 0;
  std::vector<int32_t> doc_shard_;
  std::vector<int64_t> doc_offset_, doc_length_;
  std::vector<uint8_t> doc_heldout_, doc_kind_;
};

// A read-only view of one document's tokens (pointing into a mapped shard).
struct DocumentView {
  const int32_t* ids = nullptr;
  const uint8_t* loss_mask = nullptr;
  int64_t length = 0;
};

class TokenDataset {
 public:
  // Opens a directory written by TokenShardWriter, checking that the index agrees with the shards
  // and that every id is below the recorded vocabulary size.
  static StatusOr<TokenDataset> Open(const std::string& dir);

  int64_t num_documents() const { return static_cast<int64_t>(offset_.size()); }
  int64_t vocab_size() const { return vocab_size_; }
  DocumentView document(int64_t i) const;
  bool heldout(int64_t i) const { return heldout_[i] != 0; }
  DocumentKind kind(int64_t i) const { return static_cast<DocumentKind>(kind_[i]); }
  // Indices of training (not held-out) and held-out documents, in index order.
  std::vector<int64_t> DocumentsInSplit(bool heldout) const;
  int64_t num_tokens() const { return num_tokens_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int64_t vocab_size_ = 0;
  int64_t num_tokens_ = 0;
  std::vector<SafetensorsFile> shards_;
  std::vector<const int32_t*> shard_ids_;
  std::vector<const uint8_t*> shard_mask_;
  std::vector<int32_t> shard_;
  std::vector<int64_t> offset_, length_;
  std::vector<uint8_t> heldout_, kind_;
};

}  // namespace orrery
