// Internal to model/: the storage behind InferenceState, read and written by the model's
// inference path (model/model.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "model/inference_state.h"

namespace orrery::model {

struct InferenceState::Impl {
  InferenceOptions options;
  DType dtype = DType::kF32;  // the model's; KDA recurrent state is f32 (f64 for f64 models)
  int64_t num_slots = 0;
  int64_t conv_rows = 0;     // conv_size - 1
  int64_t conv_width = 0;    // 2*H*K + H*V: q, k and v projections side by side
  int64_t latent_width = 0;  // kv_lora_rank + qk_rope_head_dim
  std::vector<bool> used;
  std::vector<int64_t> length;
  std::vector<Tensor> kda_state;               // per KDA layer: [S, H, K, V]
  std::vector<Tensor> conv_state;              // per KDA layer: [S, conv_rows, conv_width]
  std::vector<std::vector<Tensor>> mla_cache;  // per MLA layer, per slot: [capacity, width]

  // Empties `slot` (zero KDA and conv state, no cached tokens; capacity is kept).
  void ResetSlot(int64_t slot);
  // Grows every MLA cache of `slot` to hold at least `tokens` rows (contents kept).
  void Reserve(int64_t slot, int64_t tokens);
};

}  // namespace orrery::model
