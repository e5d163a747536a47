#!/usr/bin/env python3
"""The anchors of attention_gpu_bench (issue 23), timed by PyTorch in the same call: torch SDPA
through cuDNN's fused attention (and FlashAttention-2 where PyTorch's flash backend takes the
shape) on the bench's shapes — (B, T, H) = (4, 8192, 16), (1, 65536, 16), (1, 8192, 128): B
documents of T tokens, H heads, causal, bf16, qk 192 / v 128 (MLA) and 128 / 128. Median of 10
runs after 2 warm-ups (CUDA events), random inputs. FLOPs as the bench counts them: forward
2 T^2/2 (dqk + dv), backward 2 T^2/2 (3 dqk + 2 dv), per document and head. One line per shape,
backend and head dims; a backend that refuses a shape says so.

    gpu_attention_torch.py [SHAPE...]   SHAPE: 4x8192x16, 1x65536x16 or 1x8192x128 (default: all)
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import gpu_ops_torch  # the timing helper (same folder: python puts the script's on sys.path)

SHAPES = {"4x8192x16": (4, 8192, 16), "1x65536x16": (1, 65536, 16), "1x8192x128": (1, 8192, 128)}


def time_ms(fn):
    return gpu_ops_torch.time_ms(fn, warmup=2, runs=10)


def run_shape(docs, length, heads):
    for dqk, dv in ((192, 128), (128, 128)):
        q = torch.randn(docs, heads, length, dqk, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        k = torch.randn_like(q, requires_grad=True)
        v = torch.randn(docs, heads, length, dv, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        do = torch.randn(docs, heads, length, dv, device="cuda", dtype=torch.bfloat16)
        scale = dqk ** -0.5
        causal = docs * heads * length * length / 2
        fwd_flops, bwd_flops = 2 * causal * (dqk + dv), 2 * causal * (3 * dqk + 2 * dv)
        where = f"(B,T,H)=({docs},{length},{heads}) qk {dqk} v {dv}"
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("flash", SDPBackend.FLASH_ATTENTION)):
            def fwd():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            try:
                with torch.no_grad():
                    f_ms = time_ms(fwd)
                o = fwd()

                def bwd():
                    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                b_ms = time_ms(bwd)
            except RuntimeError as e:
                print(f"torch sdpa {name} {where}: not run ({str(e).splitlines()[0]})", flush=True)
                continue
            print(f"torch sdpa {name:<5} {where}  fwd {f_ms:8.3f} ms "
                  f"{fwd_flops / f_ms / 1e9:6.1f} TFLOP/s  bwd {b_ms:8.3f} ms "
                  f"{bwd_flops / b_ms / 1e9:6.1f} TFLOP/s", flush=True)
            del o
        del q, k, v, do
        torch.cuda.empty_cache()


def main():
    if not torch.cuda.is_available():
        sys.exit("gpu_attention_torch.py: no CUDA device")
    names = sys.argv[1:] or list(SHAPES)
    for n in names:
        if n not in SHAPES:
            sys.exit(f"gpu_attention_torch.py: shape {n}, expected one of {', '.join(SHAPES)}")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    torch.manual_seed(0)
    for n in names:
        run_shape(*SHAPES[n])
    return 0


if __name__ == "__main__":
    sys.exit(main())
