// The small model with every layer kind (KDA with 64-wide heads, MLA with a q LoRA, a dense MLP,
// LatentMoE with a shared expert, AttnRes blocks of 2) that the GPU model's checks share.
#pragma once

namespace orrery::model {

inline constexpr const char* kEveryLayerKindToml = R"(
[model]
vocab_size = 131
hidden_size = 64
num_layers = 4
full_attn_layers = [3]
first_k_dense = 1
dense_intermediate = 96
[model.kda]
heads = 2
head_k_dim = 64
head_v_dim = 64
decay_rank = 16
chunk_size = 64
[model.mla]
heads = 2
q_lora_rank = 32
kv_lora_rank = 32
qk_nope_head_dim = 16
qk_rope_head_dim = 8
v_head_dim = 16
[model.moe]
num_experts = 8
top_k = 2
num_shared_experts = 1
expert_intermediate = 32
shared_intermediate = 32
latent_dim = 32
[model.attn_res]
block_size = 2
)";

}  // namespace orrery::model
