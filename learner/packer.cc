#include "learner/packer.h"

#include <algorithm>

#include "core/philox.h"

namespace orrery {
namespace {
constexpr uint64_t kShuffleStream = 0x73687566;  // "shuf"
}  // namespace

DocumentPacker::DocumentPacker(const TokenDataset* dataset, std::vector<int64_t> documents,
                               uint64_t seed, bool shuffle, int32_t pad_id)
    : dataset_(dataset),
      documents_(std::move(documents)),
      seed_(seed),
      shuffle_(shuffle),
      pad_id_(pad_id) {
  BuildOrder();
}

void DocumentPacker::BuildOrder() {
  if (order_epoch_ == cursor_.epoch) return;
  order_ = documents_;
  if (shuffle_) {
    // Fisher-Yates with a generator whose stream is a pure function of (seed, epoch).
    PhiloxGenerator rng(seed_, kShuffleStream + (cursor_.epoch << 32));
    for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
      std::swap(order_[i], order_[rng.UniformInt(static_cast<uint64_t>(i + 1))]);
    }
  }
  order_epoch_ = cursor_.epoch;
}

void DocumentPacker::set_cursor(const PackerCursor& cursor) {
  cursor_ = cursor;
  BuildOrder();
}

PackedBatch DocumentPacker::Next(int64_t rows, int64_t seq_len) {
  PackedBatch b;
  b.rows = rows;
  b.seq_len = seq_len;
  b.inputs.assign(rows * seq_len, pad_id_);
  b.targets.assign(rows * seq_len, -1);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t filled = 0;
    while (filled < seq_len && !order_.empty()) {
      const DocumentView doc = dataset_->document(CurrentDocument());
      const int64_t take = std::min(seq_len - filled, doc.length - cursor_.doc_offset);
      const int64_t base = r * seq_len + filled;
      b.cu_seqlens.push_back(static_cast<int32_t>(base));
      for (int64_t j = 0; j < take; ++j) {
        const int64_t t = cursor_.doc_offset + j;
        b.inputs[base + j] = doc.ids[t];
        if (t + 1 < doc.length && doc.loss_mask[t + 1]) {
          b.targets[base + j] = doc.ids[t + 1];
          ++b.num_targets;
        }
      }
      filled += take;
      cursor_.doc_offset += take;
      if (cursor_.doc_offset == doc.length) {
        cursor_.doc_offset = 0;
        if (++cursor_.position == static_cast<int64_t>(order_.size())) {
          cursor_.position = 0;
          ++cursor_.epoch;
          BuildOrder();
        }
      }
    }
    if (filled < seq_len) b.cu_seqlens.push_back(static_cast<int32_t>(r * seq_len + filled));
  }
  b.cu_seqlens.push_back(static_cast<int32_t>(rows * seq_len));
  return b;
}

}  // namespace orrery
