// RunOp: one Orrery op on tensors read from a safetensors file, outputs written to another, so any
// other framework (fla, PyTorch, JAX) can be checked against Orrery and back. This is what
// `orrery ops run --op NAME --in IN --out OUT [--backward] [--device cpu] [--attr KEY=VALUE]...`
// runs. Tensor names, layouts and attributes per op: docs/ops.md.
//
// Ops: kda, kda_recurrent (fla chunk_kda / naive_recurrent_kda layouts), mla (the causal softmax
// attention core of gated MLA's training form, with its log-sum-exp), moe (a Stable LatentMoE
// layer), attn_res (one Block AttnRes mix), situ_glu (the GLU activation), rmsnorm, matmul (the
// GPU model's dense product), short_conv (the KDA layer's causal conv + SiLU), mla_keys (MLA's
// per-head keys and values), sigmoid_gate (the output gates), embedding (the token gather and its
// scatter-add), lm_head_loss (the LM head fused with the cross-entropy), mla_decode (absorbed MLA
// decode over a paged latent cache), mla_prefill (prefix-causal attention: new queries against
// their whole context, the MHA-form chunked prefill).
// Inputs are f32 or f64 (computed in that dtype; bf16/f16 are widened to f32). With `backward`
// the upstream gradients (named "d" + output) are read too and every input's gradient is written
// ("d" + input) beside the forward outputs.
//
// Every problem with the input (a missing or unexpected tensor, a wrong shape or dtype, an unknown
// attribute) is an InvalidArgument status naming the file, the tensor and what was expected.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace orrery::model {

struct OpRunOptions {
  std::string op;
  std::string in_path;
  std::string out_path;
  bool backward = false;
  std::string device = "cpu";                // "cpu" or "cuda" (CUDA builds with a visible GPU)
  std::map<std::string, std::string> attrs;  // op attributes (docs/ops.md)
};

// The op names RunOp accepts.
const std::vector<std::string>& OpNames();

Status RunOp(const OpRunOptions& options);

}  // namespace orrery::model
