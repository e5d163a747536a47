#!/usr/bin/env python3
"""`orrery ops run --device cuda` for rmsnorm, situ_glu and matmul on a GPU machine, through the CLI.

Writes bf16 problems with the standard-library writer of tests/integration/ops_kda_test.py, runs
each op on --device cuda (bf16 in, as the GPU model computes) and on --device cpu (f32 on the same
bf16 values), and compares every output by relative RMS error: 5e-3 for outputs rounded to bf16
on the GPU (bf16 rounding alone is ~1.7e-3 on Gaussian data), 2e-5 for f32 outputs (sums in
another order). Prints one line per tensor; exits non-zero on a failed run or an error past its
tolerance.

Usage: gpu_ops_cli.py PATH/TO/orrery
"""
import math
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import ops_kda_test as io  # noqa: E402  (the safetensors writer, reader and the runner)

BF16_TOL, F32_TOL = 5e-3, 2e-5


def rel_rms(got, want):
    num = sum((a - b) ** 2 for a, b in zip(got, want))
    den = sum(b * b for b in want)
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def gauss(rng, shape, scale=1.0):
    n = 1
    for d in shape:
        n *= d
    return (shape, [scale * rng.gauss(0, 1) for _ in range(n)])


def main():
    orrery = sys.argv[1]
    rng = random.Random(11)
    cases = [
        ("rmsnorm", ["--backward"],
         {"x": gauss(rng, [300, 96], 2.0), "w": gauss(rng, [96]), "dy": gauss(rng, [300, 96])},
         {"y": BF16_TOL, "rstd": F32_TOL, "dx": BF16_TOL, "dw": F32_TOL}),
        ("situ_glu", ["--backward"],
         {"a": gauss(rng, [4096], 6.0), "u": gauss(rng, [4096], 30.0), "dh": gauss(rng, [4096])},
         {"h": BF16_TOL, "da": BF16_TOL, "du": BF16_TOL}),
        ("matmul", ["--attr", "trans_b=1"],
         {"a": gauss(rng, [130, 70]), "b": gauss(rng, [50, 70])}, {"c": BF16_TOL}),
        ("matmul", ["--attr", "trans_a=1", "--attr", "beta=1"],
         {"a": gauss(rng, [70, 130]), "b": gauss(rng, [70, 50]), "c": gauss(rng, [130, 50])},
         {"c": F32_TOL}),
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (op, args, tensors, tolerances) in enumerate(cases):
            src = os.path.join(tmp, "in%d.safetensors" % i)
            # c (the f32 accumulator of the weight-gradient form) stays f32; the rest is bf16.
            io.write_safetensors(src, tensors, "F32", {n: "BF16" for n in tensors if n != "c"})
            got = {}
            for device in ("cuda", "cpu"):
                out = os.path.join(tmp, "%s%d.safetensors" % (device, i))
                io.run(orrery, ["--op", op, "--in", src, "--out", out, "--device", device] + args)
                got[device] = io.read_safetensors(out)
            for name, tol in tolerances.items():
                err = rel_rms(got["cuda"][name][1], got["cpu"][name][1])
                ok = err < tol
                failed += not ok
                print("ops run %-8s %s cuda vs cpu: %-5s rel RMS %.2e (tolerance %.0e) %s"
                      % (op, " ".join(args), name, err, tol, "ok" if ok else "FAILED"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
