#!/usr/bin/env python3
"""The anchor of gpu_long_context_bench's kernel lines (issues 23 and 25), timed by PyTorch in the
same call: torch SDPA on prefix-causal attention, a chunk of 8192 queries at the end of a context
of 8K, 64K and 1M keys (the causal mask aligned to the bottom right:
torch.nn.attention.bias.causal_lower_right), HEADS heads (default 8, `small`'s MLA), bf16,
qk 192 / v 128. Backends: the memory-efficient kernel (takes v 128 as it is) and FlashAttention-2
with v zero-padded to 192 (its head dims must agree; the padding's work is not counted). Median of
5 runs after 1 warm-up (CUDA events), random inputs. FLOPs as the bench counts them: 2 (dqk + dv)
per visible (query, key) pair and head. One line per backend and context; a backend that refuses
a shape says so.

    python3 scripts/gpu_prefix_attention_torch.py [HEADS]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

import gpu_ops_torch  # the timing helper (same folder: python puts the script's on sys.path)

CHUNK, DQK, DV = 8192, 192, 128


def main():
    if not torch.cuda.is_available():
        sys.exit("gpu_prefix_attention_torch.py: no CUDA device")
    heads = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}: prefix-causal SDPA, "
          f"{heads} heads, {CHUNK} queries, qk {DQK} v {DV}, bf16", flush=True)
    torch.manual_seed(0)
    for keys in (8192, 65536, 1 << 20):
        q = torch.randn(1, heads, CHUNK, DQK, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, heads, keys, DQK, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, heads, keys, DV, device="cuda", dtype=torch.bfloat16)
        bias = causal_lower_right(CHUNK, keys)
        pairs = CHUNK * (keys - CHUNK) + CHUNK * (CHUNK + 1) / 2
        flops = 2 * pairs * heads * (DQK + DV)
        for name, backend, vv in (
                ("efficient", SDPBackend.EFFICIENT_ATTENTION, v),
                ("flash (v padded to 192)", SDPBackend.FLASH_ATTENTION,
                 F.pad(v, (0, DQK - DV)))):
            def fwd():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, vv, attn_mask=bias,
                                                          scale=DQK ** -0.5)
            try:
                with torch.no_grad():
                    ms = gpu_ops_torch.time_ms(fwd, warmup=1, runs=5)
            except RuntimeError as e:
                print(f"  torch sdpa {name} keys {keys}: not run ({str(e).splitlines()[0]})",
                      flush=True)
                continue
            print(f"  torch sdpa {name:<24} keys {keys:8d}: {ms:9.3f} ms "
                  f"{flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
