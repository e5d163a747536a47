#!/usr/bin/env python3
"""`orrery ops run --op kda --device cuda` on a GPU machine, through the real CLI.

Writes a bf16 problem (q, k, v, beta and do in bf16, g and the initial state in f32) with the
standard-library writer of tests/integration/ops_kda_test.py, runs the op with --backward on
--device cuda (the tensor-core kernels take bf16 inputs) and on --device cpu (the f32 reference),
and compares every output by relative RMS error against fla's bf16 tolerances (spec/model.md 2.8:
5e-3 for outputs, 8e-3 for dq, dk, dv, dh0, 2e-2 for dg, dbeta). Prints one line per tensor;
exits non-zero on a failed run or an error past its tolerance.

Usage: gpu_ops_kda.py PATH/TO/orrery
"""
import math
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import ops_kda_test as io  # noqa: E402  (the writer, the reader, the problem and the runner)

TOLERANCES = {"o": 5e-3, "final_state": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3,
              "dinitial_state": 8e-3, "dg": 2e-2, "dbeta": 2e-2}


def rel_rms(got, want):
    num = sum((a - b) ** 2 for a, b in zip(got, want))
    den = sum(b * b for b in want)
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def main():
    orrery = sys.argv[1]
    rng = random.Random(5)
    B, T, H, K, V = 1, 200, 2, 128, 128
    t = io.problem(rng, B, T, H, K, V)
    t["do"] = ([B, T, H, V], [rng.gauss(0, 1) for _ in range(B * T * H * V)])
    bf16 = {name: "BF16" for name in ("q", "k", "v", "beta", "do")}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.safetensors")
        io.write_safetensors(src, t, "F32", bf16)
        got = {}
        for device in ("cuda", "cpu"):
            out = os.path.join(tmp, device + ".safetensors")
            io.run(orrery, ["--op", "kda", "--in", src, "--out", out, "--backward",
                            "--device", device])
            got[device] = io.read_safetensors(out)
    failed = 0
    for name, tol in TOLERANCES.items():
        err = rel_rms(got["cuda"][name][1], got["cpu"][name][1])
        ok = err < tol
        failed += not ok
        print("ops run kda bf16 cuda vs cpu: %-15s rel RMS %.2e (tolerance %.0e) %s"
              % (name, err, tol, "ok" if ok else "FAILED"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
