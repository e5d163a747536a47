#!/usr/bin/env python3
"""The anchors of attention_gpu_bench (issue 23), timed by PyTorch in the same call: torch SDPA
through cuDNN's fused attention (and FlashAttention-2 where PyTorch's flash backend takes the
shape) on the bench's case — 4 documents of 8192 tokens, 16 heads, causal, bf16, qk 192 / v 128
(MLA) and 128 / 128. Median of 10 runs after 2 warm-ups (CUDA events), random inputs. FLOPs as
the bench counts them: forward 2 T^2/2 (dqk + dv), backward 2 T^2/2 (3 dqk + 2 dv), per document
and head. One line per backend and pass; a backend that refuses a shape says so.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import gpu_ops_torch  # the timing helper (same folder: python puts the script's on sys.path)

DOCS, LEN, HEADS = 4, 8192, 16


def time_ms(fn):
    return gpu_ops_torch.time_ms(fn, warmup=2, runs=10)


def main():
    if not torch.cuda.is_available():
        sys.exit("gpu_attention_torch.py: no CUDA device")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    torch.manual_seed(0)
    for dqk, dv in ((192, 128), (128, 128)):
        q = torch.randn(DOCS, HEADS, LEN, dqk, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        k = torch.randn_like(q, requires_grad=True)
        v = torch.randn(DOCS, HEADS, LEN, dv, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        do = torch.randn(DOCS, HEADS, LEN, dv, device="cuda", dtype=torch.bfloat16)
        scale = dqk ** -0.5
        causal = DOCS * HEADS * LEN * LEN / 2
        fwd_flops, bwd_flops = 2 * causal * (dqk + dv), 2 * causal * (3 * dqk + 2 * dv)
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
                print(f"torch sdpa {name} qk {dqk} v {dv}: not run ({str(e).splitlines()[0]})",
                      flush=True)
                continue
            print(f"torch sdpa {name:<5} qk {dqk} v {dv}  fwd {f_ms:8.3f} ms "
                  f"{fwd_flops / f_ms / 1e9:6.1f} TFLOP/s  bwd {b_ms:8.3f} ms "
                  f"{bwd_flops / b_ms / 1e9:6.1f} TFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
