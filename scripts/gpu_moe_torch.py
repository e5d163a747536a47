#!/usr/bin/env python3
"""The anchor of moe_layer_gpu_bench (issue 24), timed by PyTorch in the same call: the Stable
LatentMoE layer of scripts/gpu_model_torch.py (`moe_layer`: fp32 sigmoid router, top-k on scores,
renormalised weights, latent down-projection, the routed experts on torch._grouped_mm with SiTU-GLU,
the weighted combine by index_add in fp32, latent RMSNorm, up-projection, the shared SiTU MLP),
eager, fp32 master weights under bf16 autocast, on the bench's shapes and token count: bench-1b's
layer and the fine-grained one. Forward, and forward + backward (gradients of the input and every
weight). Median of 10 runs after 3 warm-ups (CUDA events); FLOPs counted as the bench counts them.

    python3 scripts/gpu_moe_torch.py [TOKENS]
"""
import sys
import types

import torch

import gpu_model_torch  # the layer (same folder: python puts the script's on sys.path)
import gpu_ops_torch  # the timing helper

SHAPES = (("bench-1b", 1536, 768, 64, 8, 512, 1536),
          ("fine-grained", 2048, 1024, 128, 8, 384, 1024))


class LayerWeights(dict):
    """What moe_layer reads: weights by name and the balancing bias per layer."""

    def __init__(self, experts):
        super().__init__()
        self.bias = {0: torch.zeros(experts, device="cuda", dtype=torch.float32)}


def bench(name, d, latent, experts, top_k, width, shared, tokens):
    c = types.SimpleNamespace(experts=experts, top_k=top_k, rho=1.0, latent=latent,
                              latent_norm=True, eps=1e-5, shared=1, situ=True, situ_beta=4.0,
                              situ_lin=25.0)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def param(*shape):
        w = torch.randn(*shape, device="cuda", generator=gen) / shape[-1] ** 0.5
        return w.requires_grad_()

    W = LayerWeights(experts)
    p = "layers.0.moe"
    W[p + ".router"] = param(experts, d)
    W[p + ".down"] = param(latent, d)
    W[p + ".up"] = param(d, latent)
    W[p + ".latent_norm"] = torch.ones(latent, device="cuda", requires_grad=True)
    W[p + ".experts.w1"] = param(experts, width, latent)
    W[p + ".experts.w3"] = param(experts, width, latent)
    W[p + ".experts.w2"] = param(experts, latent, width)
    W[p + ".shared.w1"] = param(shared, d)
    W[p + ".shared.w3"] = param(shared, d)
    W[p + ".shared.w2"] = param(d, shared)
    x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    x.requires_grad_()
    dy = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, generator=gen)

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return gpu_model_torch.moe_layer(c, W, 0, x, None, {})

    def forward_backward():
        forward().backward(dy)

    def fwd_no_grad():
        with torch.no_grad():
            forward()

    flops = 2.0 * tokens * (d * experts + 2 * d * latent + top_k * 3 * latent * width
                            + 3 * d * shared)
    torch.cuda.reset_peak_memory_stats()
    fwd = gpu_ops_torch.time_ms(fwd_no_grad, warmup=3, runs=10)
    both = gpu_ops_torch.time_ms(forward_backward, warmup=3, runs=10)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch moe layer {name:14s} tokens {tokens:6d} d {d:5d} latent {latent:5d} "
          f"E {experts:4d} top-{top_k} width {width:4d} shared {shared:5d}  "
          f"fwd {fwd:8.3f} ms {tokens / (fwd * 1e-3):9.0f} tok/s "
          f"{flops / (fwd * 1e-3) / 1e12:6.1f} TFLOP/s  fwd+bwd {both:8.3f} ms "
          f"{tokens / (both * 1e-3):9.0f} tok/s {3 * flops / (both * 1e-3) / 1e12:6.1f} TFLOP/s  "
          f"peak {peak:.2f} GiB", flush=True)


def main():
    if not torch.cuda.is_available():
        sys.exit("gpu_moe_torch.py: no CUDA device")
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for shape in SHAPES:
        bench(*shape, tokens)


if __name__ == "__main__":
    main()
