// Packs documents into fixed-length rows with document boundaries (the varlen layout the model
// consumes: KDA and conv state reset, and MLA masks, at every boundary in cu_seqlens).
//
// A row is filled greedily with pieces of documents in a deterministic shuffled order: a document
// that does not fit is cut, and its remainder starts the next row. Position j of a piece whose
// tokens are doc[a, b) has input doc[a + j] and target doc[a + j + 1] when that token exists in
// the document and its loss mask is 1, else -1 (no loss). So a cut loses no target, and only the
// last token of each document predicts nothing. The order is a Philox permutation of the document
// list per epoch, a pure function of (seed, epoch): the cursor alone restores the stream.
#pragma once

#include <cstdint>
#include <vector>

#include "learner/token_shards.h"

namespace orrery {

struct PackedBatch {
  int64_t rows = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> inputs;      // [rows * seq_len]
  std::vector<int32_t> targets;     // [rows * seq_len]; -1: no loss at this position
  std::vector<int32_t> cu_seqlens;  // segment starts in the flattened rows, then rows * seq_len;
                                    // every row start is a boundary; padding is its own segment
  int64_t num_targets = 0;          // positions with a target
};

struct PackerCursor {
  uint64_t epoch = 0;
  int64_t position = 0;    // index into the epoch's document order
  int64_t doc_offset = 0;  // tokens of that document already consumed
  friend bool operator==(const PackerCursor&, const PackerCursor&) = default;
};

class DocumentPacker {
 public:
  // `documents` are indices into `dataset` (e.g. its training split); shuffle=false keeps their
  // order (evaluation). `pad_id` fills unused positions.
  DocumentPacker(const TokenDataset* dataset, std::vector<int64_t> documents, uint64_t seed,
                 bool shuffle, int32_t pad_id);

  // The next `rows` rows of `seq_len` tokens. Wraps around to a new epoch when documents run out.
  PackedBatch Next(int64_t rows, int64_t seq_len);

  const PackerCursor& cursor() const { return cursor_; }
  void set_cursor(const PackerCursor& cursor);
  int64_t num_documents() const { return static_cast<int64_t>(documents_.size()); }

 private:
  void BuildOrder();
  int64_t CurrentDocument() const { return order_[cursor_.position]; }

  const TokenDataset* dataset_;
  std::vector<int64_t> documents_;
  uint64_t seed_;
  bool shuffle_;
  int32_t pad_id_;
  PackerCursor cursor_;
  uint64_t order_epoch_ = UINT64_MAX;
  std::vector<int64_t> order_;
};

}  // namespace orrery
