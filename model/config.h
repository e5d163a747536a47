// ModelConfig: every architecture field of the hybrid K3-style model (spec/model.md §1), read from
// the [model] table of a TOML file, plus the parameter, state and FLOP arithmetic behind
// `orrery model info`.
//
//   [model]                      vocab_size, hidden_size, num_layers, full_attn_layers (1-based
//                                MLA positions; the others are KDA), rms_norm_eps,
//                                first_k_dense, dense_intermediate, max_seq_len
//   [model.kda]                  heads, head_k_dim, head_v_dim, conv_size, gate, gate_lower_bound,
//                                decay_rank, output_gate_rank, chunk_size, algorithm, device
//   [model.mla]                  heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
//                                qk_rope_head_dim, v_head_dim, output_gate, lora_eps
//   [model.moe]                  num_experts, top_k, num_shared_experts, expert_intermediate,
//                                shared_intermediate, latent_dim, latent_norm,
//                                routed_scaling_factor, balancing, balancing_step
//   [model.activation]           kind (situ | silu), situ_beta, situ_linear_beta
//   [model.attn_res]             block_size (0: plain residual stream)
//
// Invalid combinations (top_k > num_experts, a layer index out of range, a chunk size the KDA
// kernel does not support, ...) are rejected through ConfigTable::Fail with the key and the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/status.h"

namespace orrery::model {

enum class LayerKind { kKda, kMla };
enum class GateKind { kBounded, kOriginal };  // spec §2.2
// Where the KDA layer's core op (the chunked forward and backward, kernels/kda.h) runs: on the CPU
// in the model's dtype, or on CUDA device 0 (bf16 tensor-core kernels for K, V in {64, 128}, f32
// kernels otherwise; model/layers/kda_core.h). The rest of the model stays on the CPU.
enum class KdaDevice { kCpu, kCuda };
enum class Activation { kSitu, kSilu };  // spec §5.3; SiLU-GLU for Kimi Linear
// Quantile Balancing forms of spec §5.4: the public (k+1)-th cut-off form, the exclusive-margin
// form (our proposal, the default), or no bias updates.
enum class Balancing { kNone, kQuantileCutoff, kQuantileExclusive };

struct KdaConfig {
  int64_t heads = 4;
  int64_t head_k_dim = 32;
  int64_t head_v_dim = 32;
  int64_t conv_size = 4;
  GateKind gate = GateKind::kBounded;
  double gate_lower_bound = -5.0;  // g_min of the bounded gate
  int64_t decay_rank = 32;         // z = W_fb W_fa x, D -> decay_rank -> H*K
  int64_t output_gate_rank = 0;    // 0: full-rank W_g (K3); r > 0: D -> r -> H*V with bias
  int64_t chunk_size = 64;         // 16, 32 or 64
  bool recurrent = false;          // use the token-by-token core (an oracle) instead of chunked
  // "cuda" needs a build with the CUDA kernels, the chunked algorithm, head_k_dim <= 128 and an
  // f32 model (Model::Create rejects f64); a missing GPU fails the first forward.
  KdaDevice device = KdaDevice::kCpu;
};

struct MlaConfig {
  int64_t heads = 4;
  int64_t q_lora_rank = 0;  // 0: q = W_q x directly (Kimi Linear)
  int64_t kv_lora_rank = 64;
  int64_t qk_nope_head_dim = 32;
  int64_t qk_rope_head_dim = 16;  // the shared, unrotated "rope slot" (NoPE)
  int64_t v_head_dim = 32;
  bool output_gate = true;
  double lora_eps = 1e-6;
};

struct MoeConfig {
  int64_t num_experts = 8;
  int64_t top_k = 2;
  int64_t num_shared_experts = 1;
  int64_t expert_intermediate = 64;
  int64_t shared_intermediate = 64;  // width of the one shared SiTU MLP (0: none)
  int64_t latent_dim = 0;            // 0: experts act on the full width (no latent projections)
  bool latent_norm = true;           // RMSNorm of the weighted latent sum (Stable LatentMoE)
  double routed_scaling_factor = 1.0;
  Balancing balancing = Balancing::kQuantileExclusive;
  double balancing_step = 1.0;  // eta of spec §5.4 step 5
};

struct ModelConfig {
  std::string name = "model";
  int64_t vocab_size = 1024;
  int64_t hidden_size = 128;
  int64_t num_layers = 4;
  std::vector<LayerKind> layers;  // num_layers entries
  double rms_norm_eps = 1e-5;
  int64_t first_k_dense = 1;  // layers [0, first_k_dense) use the dense MLP
  int64_t dense_intermediate = 256;
  KdaConfig kda;
  MlaConfig mla;
  MoeConfig moe;
  Activation activation = Activation::kSitu;
  double situ_beta = 4.0;
  double situ_linear_beta = 25.0;   // <= 0: no cap on the up branch
  int64_t attn_res_block_size = 0;  // 0: standard residual stream
  // The longest sequence the model is meant to see, in tokens: pretraining stages and decode
  // contexts beyond it are refused. The architecture has no positional limit (NoPE MLA, recurrent
  // KDA); this is the context the model is trained and served for. Default: 1M (K3's context).
  int64_t max_seq_len = int64_t{1} << 20;

  bool is_moe_layer(int64_t l) const { return l >= first_k_dense; }
  int64_t num_moe_layers() const {
    return num_layers > first_k_dense ? num_layers - first_k_dense : 0;
  }
  int64_t num_kda_layers() const;
  int64_t num_mla_layers() const { return num_layers - num_kda_layers(); }
  int64_t kda_key_width() const { return kda.heads * kda.head_k_dim; }    // P_k
  int64_t kda_value_width() const { return kda.heads * kda.head_v_dim; }  // P_v
  int64_t mla_qk_head_dim() const { return mla.qk_nope_head_dim + mla.qk_rope_head_dim; }
  // The width experts work in: latent_dim, or hidden_size without latent projections.
  int64_t expert_width() const { return moe.latent_dim > 0 ? moe.latent_dim : hidden_size; }
  // "KKKM" style summary of the layer schedule.
  std::string LayerPattern() const;
};

// Reads root.[model] (every key of the table above). Errors are recorded in the document and
// returned; the caller still runs ConfigDocument::Finish() for unknown keys.
StatusOr<ModelConfig> ReadModelConfig(ConfigTable& root);
// Parses `path` (a file holding [model] only), reads it and fails on any key nobody read. A config
// that embeds [model] among other sections calls ReadModelConfig on its own document instead.
StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// Parameter counts by component (spec §1.2 arithmetic). "active" counts what one token touches:
// top_k of the routed experts.
struct ParamBreakdown {
  struct Row {
    std::string component;
    int64_t total = 0;
    int64_t active = 0;
  };
  std::vector<Row> rows;  // embeddings, kda, mla, dense_mlp, routed_experts, shared_experts,
                          // latent_projections, router, attn_res, norms, lm_head
  int64_t total_params = 0;
  int64_t active_params = 0;
  int64_t kda_state_bytes_per_sequence = 0;  // f32 recurrent state + f32 conv state
  int64_t mla_cache_bytes_per_token_bf16 = 0;
  int64_t mla_cache_bytes_per_token_f32 = 0;
  double forward_flops_per_token = 0;  // at the context length given
};
ParamBreakdown ComputeParamBreakdown(const ModelConfig& config, int64_t context_length);

}  // namespace orrery::model
