#!/usr/bin/env python3
"""Times fla's chunk_kda on the GPU machine, for the side-by-side table in docs/benchmarks.md.

Run by scripts/gpu_kda.sh with fla's package on PYTHONPATH (a copy carried in .fla/, never
committed). Bounded gate computed in the kernel (lower_bound=-5), safe_gate on and off, q/k L2 norm
and beta sigmoid in the kernel, the layer's call. Prints one line per case:
  fla <shape> safe_gate=<b> fwd_ms=<median> fwdbwd_ms=<median>
"""
import sys

import torch
import triton.testing

SHAPES = [(8, 8192, 16, 128), (1, 65536, 16, 128), (1, 8192, 96, 128)]


def parse_shapes(args):
    """--shape B,T,H,D (repeatable) replaces SHAPES: each shape's compilation and autotuning
    take minutes, so a device call can time a subset."""
    shapes = []
    i = 0
    while i < len(args):
        if args[i] != "--shape" or i + 1 >= len(args):
            sys.exit(f"gpu_kda_fla.py: unknown argument {args[i]!r} (expected --shape B,T,H,D)")
        try:
            shape = tuple(int(x) for x in args[i + 1].split(","))
        except ValueError:
            shape = ()
        if len(shape) != 4 or min(shape) < 1:
            sys.exit(f"gpu_kda_fla.py: --shape {args[i + 1]!r}: expected four positive integers B,T,H,D")
        shapes.append(shape)
        i += 2
    return shapes or SHAPES


def main():
    from fla.ops.kda import chunk_kda  # here, so that gpu_kda_flashkda.py can import parse_shapes

    shapes = parse_shapes(sys.argv[1:])
    torch.manual_seed(0)
    dev = "cuda"
    for (b, t, h, d) in shapes:
        q = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        beta = torch.randn(b, t, h, device=dev, dtype=torch.bfloat16, requires_grad=True)
        a_log = torch.zeros(h, device=dev, dtype=torch.float32, requires_grad=True)
        dt_bias = torch.zeros(h * d, device=dev, dtype=torch.float32, requires_grad=True)
        do = torch.randn_like(v)
        for safe in (True, False):
            def fwd():
                return chunk_kda(q, k, v, g, beta, A_log=a_log, dt_bias=dt_bias,
                                 use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                 use_beta_sigmoid_in_kernel=True, safe_gate=safe,
                                 lower_bound=-5.0, chunk_size=64)[0]

            def fwd_bwd():
                o = fwd()
                o.backward(do)

            with torch.no_grad():
                f_ms = triton.testing.do_bench(fwd, warmup=50, rep=300, return_mode="median")
            fb_ms = triton.testing.do_bench(fwd_bwd, warmup=50, rep=300, return_mode="median",
                                            grad_to_none=[q, k, v, g, beta, a_log, dt_bias])
            print(f"fla B={b} T={t} H={h} K=V={d} safe_gate={safe} fwd_ms={f_ms:.3f} "
                  f"fwdbwd_ms={fb_ms:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
