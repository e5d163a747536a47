"""The anchor of grouped_gemm_gpu_bench: torch._grouped_mm timed by PyTorch in the same call.

The same shapes and the same per-expert counts as tests/gpu/grouped_gemm_gpu_bench.cc (its header
gives the formula), bf16 inputs, random values; median of 20 CUDA-event timings after 3 warm-ups.
The three products as torch._grouped_mm takes them (offs: int32 cumulative row ends, [E]):
  Y  = X W_e^T:     _grouped_mm(x [M, K], w.transpose(1, 2) [E, K, N], offs)      -> [M, N]
  dX = dY W_e:      _grouped_mm(dy [M, N], w [E, N, K], offs)                     -> [M, K]
  dW_e = dY_e^T X_e: _grouped_mm(dy.t() [N, M], x [M, K], offs) (offs along M)    -> [E, N, K]
Outputs are bf16 (Orrery's bench writes dX in f32 and accumulates dW in f32).
The anchors are timed forward only (as the issue's figures), the training shapes in all three.
  python3 scripts/gpu_grouped_gemm_torch.py [--quick]   (--quick: the anchors only)
"""
import math
import sys

import torch


def time_ms(fn, warmup=3, runs=20):
    """Median of `runs` CUDA-event timings after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def offsets(m, e):
    """The bench's counts: weight_i = 0.75 + 0.5 frac(0.6180339887 i), cumulative, floor."""
    w = []
    for i in range(e):
        f = 0.6180339887 * i
        w.append(0.75 + 0.5 * (f - math.floor(f)))
    total = sum(w)
    off, acc = [0], 0.0
    for i in range(e):
        acc += w[i]
        off.append(m if i + 1 == e else int(math.floor(m * acc / total)))
    return off


def bench(name, m, e, n, k, forward_only):
    dev = "cuda"
    off = offsets(m, e)
    offs = torch.tensor(off[1:], device=dev, dtype=torch.int32)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    w = torch.randn(e, n, k, device=dev, dtype=torch.bfloat16) / math.sqrt(k)
    products = [("Y = X W_e^T (bf16)", lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs))]
    if not forward_only:
        products.append(("dX = dY W_e (bf16)", lambda: torch._grouped_mm(dy, w, offs=offs)))
        products.append(("dW_e = dY^T X (bf16)", lambda: torch._grouped_mm(dy.t(), x, offs=offs)))
    flops = 2.0 * m * n * k
    for pname, fn in products:
        try:
            ms = time_ms(fn)
            print(f"torch._grouped_mm {name:<26} {pname:<21} M {m:7d} E {e:4d} N {n:5d} K {k:5d}"
                  f"  {ms:8.3f} ms {flops / (ms * 1e-3) / 1e12:6.1f} TF", flush=True)
        except RuntimeError as err:  # a product this torch does not take: say so, go on
            print(f"torch._grouped_mm {name:<26} {pname:<21} failed: {str(err).splitlines()[0]}",
                  flush=True)


def main():
    quick = "--quick" in sys.argv[1:]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    if not quick:
        bench("small", 131072, 32, 512, 512, False)
        bench("bench-1b gate/up [F, L]", 131072, 64, 512, 768, False)
        bench("bench-1b down [L, F]", 131072, 64, 768, 512, False)
    for e, n, k in [(32, 1024, 1024), (128, 768, 768), (64, 3584, 3072)]:
        for rows in [128, 512, 2048, 8192]:
            bench(f"anchor {rows} rows/expert", e * rows, e, n, k, True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
