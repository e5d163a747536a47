"""The anchors of ops_gpu_bench, timed by PyTorch in the same call (scripts/gpu_ops.sh).

torch.matmul (cuBLAS) at the bench's product shapes, torch.nn.functional.rms_norm at its norm
shapes, and a large device-to-device copy (the memory-bandwidth ceiling). Median of 30 runs after
5 warm-ups, timed with CUDA events, random inputs.
"""
import torch


def time_ms(fn, warmup=5, runs=30):
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


def main():
    dev = "cuda"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    shapes = [("y = x W^T  8192x2048 . 2048x2048", 8192, 2048, 2048),
              ("logits  8192x2048 . 2048x32768", 8192, 32768, 2048),
              ("y = x W^T  16384x7168 . 7168x7168", 16384, 7168, 7168)]
    for name, m, n, k in shapes:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        ms = time_ms(lambda: torch.matmul(x, w.t()))
        print(f"torch.matmul {name:<32} {ms:10.3f} {2 * m * n * k / (ms * 1e-3) / 1e12:8.1f} TFLOP/s")
    for rows, d in [(32768, 2048), (16384, 7168)]:
        x = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
        w = torch.randn(d, device=dev, dtype=torch.bfloat16)
        ms = time_ms(lambda: torch.nn.functional.rms_norm(x, (d,), w, 1e-6))
        print(f"torch rms_norm fwd bf16 {rows}x{d:<14} {ms:10.3f} "
              f"{2 * rows * d * 2 / (ms * 1e-3) / 1e9:8.1f} GB/s")
    src = torch.randn(1 << 28, device=dev)  # 1 GiB
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    print(f"device copy 1 GiB (read + write)              {ms:10.3f} "
          f"{2 * src.numel() * 4 / (ms * 1e-3) / 1e9:8.1f} GB/s")


if __name__ == "__main__":
    main()
