#include "model/config.h"

#include <algorithm>
#include <set>

namespace orrery::model {

int64_t ModelConfig::num_kda_layers() const {
  return std::count(layers.begin(), layers.end(), LayerKind::kKda);
}

std::string ModelConfig::LayerPattern() const {
  std::string s;
  for (LayerKind k : layers) s += k == LayerKind::kKda ? 'K' : 'M';
  return s;
}

namespace {

void ReadKda(ConfigTable t, int64_t hidden, KdaConfig* c) {
  c->heads = t.Int("heads", c->heads, 1, 4096);
  c->head_k_dim = t.Int("head_k_dim", c->head_k_dim, 1, 256);
  c->head_v_dim = t.Int("head_v_dim", c->head_v_dim, 1, 1024);
  c->conv_size = t.Int("conv_size", c->conv_size, 1, 16);
  const std::string gate = t.Enum("gate", "bounded", {"bounded", "original"});
  c->gate = gate == "bounded" ? GateKind::kBounded : GateKind::kOriginal;
  c->gate_lower_bound = t.Float("gate_lower_bound", c->gate_lower_bound, -100.0, -1e-6);
  c->decay_rank = t.Int("decay_rank", std::min<int64_t>(c->decay_rank, hidden), 1, 1 << 16);
  c->output_gate_rank = t.Int("output_gate_rank", c->output_gate_rank, 0, 1 << 16);
  c->chunk_size = t.Int("chunk_size", c->chunk_size, 1, 1024);
  if (c->chunk_size != 16 && c->chunk_size != 32 && c->chunk_size != 64) {
    t.Fail("chunk_size", "expected 16, 32 or 64 (the chunk sizes the KDA kernels implement), got " +
                             std::to_string(c->chunk_size));
  }
  const std::string algo = t.Enum("algorithm", "chunked", {"chunked", "recurrent"});
  c->recurrent = algo == "recurrent";
  const std::string device = t.Enum("device", "cpu", {"cpu", "cuda"});
  c->device = device == "cuda" ? KdaDevice::kCuda : KdaDevice::kCpu;
  if (c->device != KdaDevice::kCuda) return;
#if !defined(ORRERY_KERNELS_CUDA)
  t.Fail("device",
         "\"cuda\" needs a build with the CUDA kernels (configure with -DORRERY_CUDA=ON)");
#else
  if (c->recurrent) {
    t.Fail("device",
           "\"cuda\" runs the chunked algorithm only (algorithm = \"recurrent\" is the "
           "CPU oracle)");
  } else if (c->head_k_dim > 128) {
    t.Fail("device", "\"cuda\" needs head_k_dim <= 128 (the CUDA kernels' limit), got " +
                         std::to_string(c->head_k_dim));
  }
#endif
}

void ReadMla(ConfigTable t, MlaConfig* c) {
  c->heads = t.Int("heads", c->heads, 1, 4096);
  c->q_lora_rank = t.Int("q_lora_rank", c->q_lora_rank, 0, 1 << 16);
  c->kv_lora_rank = t.Int("kv_lora_rank", c->kv_lora_rank, 1, 1 << 16);
  c->qk_nope_head_dim = t.Int("qk_nope_head_dim", c->qk_nope_head_dim, 1, 1024);
  c->qk_rope_head_dim = t.Int("qk_rope_head_dim", c->qk_rope_head_dim, 0, 1024);
  c->v_head_dim = t.Int("v_head_dim", c->v_head_dim, 1, 1024);
  c->output_gate = t.Bool("output_gate", c->output_gate);
  c->lora_eps = t.Float("lora_eps", c->lora_eps, 1e-12, 1.0);
}

void ReadMoe(ConfigTable t, MoeConfig* c) {
  c->num_experts = t.Int("num_experts", c->num_experts, 1, 1 << 16);
  c->top_k = t.Int("top_k", c->top_k, 1, 1024);
  if (c->top_k > c->num_experts) {
    t.Fail("top_k", "top_k (" + std::to_string(c->top_k) + ") exceeds num_experts (" +
                        std::to_string(c->num_experts) + ")");
  }
  c->num_shared_experts = t.Int("num_shared_experts", c->num_shared_experts, 0, 64);
  c->expert_intermediate = t.Int("expert_intermediate", c->expert_intermediate, 1, 1 << 20);
  c->shared_intermediate =
      t.Int("shared_intermediate", c->num_shared_experts * c->expert_intermediate, 0, 1 << 22);
  if (c->num_shared_experts == 0 && c->shared_intermediate != 0) {
    t.Fail("shared_intermediate", "must be 0 when num_shared_experts is 0");
  }
  if (c->num_shared_experts > 0 && c->shared_intermediate == 0) {
    t.Fail("shared_intermediate", "must be > 0 when num_shared_experts > 0");
  }
  c->latent_dim = t.Int("latent_dim", c->latent_dim, 0, 1 << 20);
  c->latent_norm = t.Bool("latent_norm", c->latent_dim > 0);
  c->routed_scaling_factor = t.Float("routed_scaling_factor", c->routed_scaling_factor, 1e-6, 1e6);
  const std::string bal =
      t.Enum("balancing", "quantile_exclusive", {"none", "quantile_cutoff", "quantile_exclusive"});
  c->balancing = bal == "none"              ? Balancing::kNone
                 : bal == "quantile_cutoff" ? Balancing::kQuantileCutoff
                                            : Balancing::kQuantileExclusive;
  c->balancing_step = t.Float("balancing_step", c->balancing_step, 1e-6, 1.0);
  if (c->top_k == c->num_experts && c->balancing != Balancing::kNone) {
    t.Fail("balancing", "quantile balancing needs top_k < num_experts (set balancing = \"none\")");
  }
}

}  // namespace

StatusOr<ModelConfig> ReadModelConfig(ConfigTable& root) {
  ModelConfig c;
  if (!root.Has("model")) return InvalidArgumentError("missing the [model] table");
  ConfigTable t = root.Table("model");
  c.name = t.String("name", c.name);
  c.vocab_size = t.RequiredInt("vocab_size", 2, int64_t{1} << 24);
  c.hidden_size = t.RequiredInt("hidden_size", 1, 1 << 20);
  c.num_layers = t.RequiredInt("num_layers", 1, 4096);
  const std::vector<int64_t> full = t.IntList("full_attn_layers", {}, 1, 4096);
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerKind::kKda);
  std::set<int64_t> seen;
  for (int64_t l : full) {
    if (l > c.num_layers) {
      t.Fail("full_attn_layers", "layer " + std::to_string(l) + " is beyond num_layers = " +
                                     std::to_string(c.num_layers) + " (indices are 1-based)");
      break;
    }
    if (!seen.insert(l).second) {
      t.Fail("full_attn_layers", "layer " + std::to_string(l) + " is listed twice");
      break;
    }
    c.layers[static_cast<size_t>(l - 1)] = LayerKind::kMla;
  }
  c.rms_norm_eps = t.Float("rms_norm_eps", c.rms_norm_eps, 1e-12, 1.0);
  c.first_k_dense = t.Int("first_k_dense", c.first_k_dense, 0, c.num_layers);
  c.dense_intermediate =
      t.Int("dense_intermediate", c.first_k_dense > 0 ? 4 * c.hidden_size : 0, 0, 1 << 22);
  if (c.first_k_dense > 0 && c.dense_intermediate == 0) {
    t.Fail("dense_intermediate", "must be > 0 when first_k_dense > 0");
  }
  if (c.num_kda_layers() > 0) ReadKda(t.Table("kda"), c.hidden_size, &c.kda);
  if (c.num_mla_layers() > 0) ReadMla(t.Table("mla"), &c.mla);
  if (c.num_moe_layers() > 0) ReadMoe(t.Table("moe"), &c.moe);
  ConfigTable act = t.Table("activation");
  c.activation =
      act.Enum("kind", "situ", {"situ", "silu"}) == "situ" ? Activation::kSitu : Activation::kSilu;
  if (c.activation == Activation::kSitu) {
    c.situ_beta = act.Float("situ_beta", c.situ_beta, 1e-3, 1e6);
    c.situ_linear_beta = act.Float("situ_linear_beta", c.situ_linear_beta, 0.0, 1e6);
  }
  c.attn_res_block_size = t.Table("attn_res").Int("block_size", 0, 0, 4096);
  c.max_seq_len = t.Int("max_seq_len", c.max_seq_len, 1, int64_t{1} << 40);
  // Errors recorded by the getters surface here (Finish() repeats the first one).
  return c;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseFile(path));
  ConfigTable root = doc.root();
  StatusOr<ModelConfig> config = ReadModelConfig(root);
  ORRERY_RETURN_IF_ERROR(doc.Finish());
  return config;
}

namespace {

int64_t SwigluParams(int64_t in, int64_t hidden) { return 3 * in * hidden; }

}  // namespace

ParamBreakdown ComputeParamBreakdown(const ModelConfig& c, int64_t context_length) {
  const int64_t d = c.hidden_size;
  const int64_t n_kda = c.num_kda_layers(), n_mla = c.num_mla_layers();
  const int64_t n_moe = c.num_moe_layers(), n_dense = c.num_layers - n_moe;
  ParamBreakdown b;
  auto add = [&b](const std::string& name, int64_t total, int64_t active) {
    b.rows.push_back({name, total, active});
    b.total_params += total;
    b.active_params += active;
  };
  add("embeddings", c.vocab_size * d, c.vocab_size * d);

  const KdaConfig& k = c.kda;
  const int64_t pk = c.kda_key_width(), pv = c.kda_value_width();
  int64_t kda = 2 * pk * d + pv * d;            // W_q, W_k, W_v
  kda += (2 * pk + pv) * k.conv_size;           // depthwise conv
  kda += k.decay_rank * d + pk * k.decay_rank;  // W_fa, W_fb
  kda += k.heads + pk;                          // A_log, dt_bias
  kda += k.heads * d;                           // W_beta
  kda += k.head_v_dim;                          // output RMSNorm gain
  kda += k.output_gate_rank > 0 ? k.output_gate_rank * d + pv * k.output_gate_rank + pv : pv * d;
  kda += d * pv;  // W_o
  add("kda", n_kda * kda, n_kda * kda);

  const MlaConfig& m = c.mla;
  const int64_t dqk = c.mla_qk_head_dim();
  int64_t mla = m.q_lora_rank > 0
                    ? m.q_lora_rank * d + m.q_lora_rank + m.heads * dqk * m.q_lora_rank
                    : m.heads * dqk * d;
  mla += (m.kv_lora_rank + m.qk_rope_head_dim) * d + m.kv_lora_rank;
  mla += m.heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank;
  if (m.output_gate) mla += m.heads * m.v_head_dim * d;
  mla += d * m.heads * m.v_head_dim;
  add("mla", n_mla * mla, n_mla * mla);

  const int64_t dense = SwigluParams(d, c.dense_intermediate);
  add("dense_mlp", n_dense * dense, n_dense * dense);

  const MoeConfig& e = c.moe;
  const int64_t ew = c.expert_width();
  const int64_t expert = SwigluParams(ew, e.expert_intermediate);
  add("routed_experts", n_moe * e.num_experts * expert, n_moe * e.top_k * expert);
  const int64_t shared = SwigluParams(d, e.shared_intermediate);
  add("shared_experts", n_moe * shared, n_moe * shared);
  const int64_t latent = e.latent_dim > 0
                             ? 2 * e.latent_dim * d + (e.latent_norm ? e.latent_dim : 0)
                             : (e.latent_norm ? d : 0);
  add("latent_projections", n_moe * latent, n_moe * latent);
  add("router", n_moe * e.num_experts * d, n_moe * e.num_experts * d);
  const int64_t attn_res = c.attn_res_block_size > 0 ? (4 * c.num_layers + 2) * d : 0;
  add("attn_res", attn_res, attn_res);
  add("norms", (2 * c.num_layers + 1) * d, (2 * c.num_layers + 1) * d);
  add("lm_head", c.vocab_size * d, c.vocab_size * d);

  b.kda_state_bytes_per_sequence =
      n_kda * (k.heads * k.head_k_dim * k.head_v_dim + (k.conv_size - 1) * (2 * pk + pv)) * 4;
  b.mla_cache_bytes_per_token_bf16 = n_mla * (m.kv_lora_rank + m.qk_rope_head_dim) * 2;
  b.mla_cache_bytes_per_token_f32 = n_mla * (m.kv_lora_rank + m.qk_rope_head_dim) * 4;

  // Forward FLOPs per token: 2 per active matmul weight (embedding lookup excluded), plus the
  // sequence mixers: causal MLA at context L averages L/2 keys; KDA chunked core per head
  // 6KV + C(6K + 4V) + C^2/2 (spec §2.7).
  double flops = 2.0 * static_cast<double>(b.active_params - c.vocab_size * d);
  const double half_l = static_cast<double>(context_length) / 2.0;
  flops += static_cast<double>(n_mla) * m.heads * 2.0 * (dqk + m.v_head_dim) * half_l;
  const double kk = static_cast<double>(k.head_k_dim), vv = static_cast<double>(k.head_v_dim);
  const double cc = static_cast<double>(k.chunk_size);
  flops +=
      static_cast<double>(n_kda) * k.heads * (6 * kk * vv + cc * (6 * kk + 4 * vv) + cc * cc / 2);
  b.forward_flops_per_token = flops;
  return b;
}

}  // namespace orrery::model
