#!/usr/bin/env python3
"""`orrery ops run --device cuda` against --device cpu on a GPU machine, through the CLI.

For rmsnorm, situ_glu, matmul, short_conv, attn_res, mla, mla_keys, sigmoid_gate, moe, embedding,
lm_head_loss, mla_decode, mla_prefill and grouped_gemm: writes bf16 problems with the standard-library writer of
tests/integration/ops_kda_test.py (integer inputs as i64), runs each op on --device cuda (bf16 in,
as the GPU model computes) and on --device cpu (f32 on the same bf16 values), and compares every
output by relative RMS error: 5e-3 for outputs rounded to bf16 on the GPU (bf16 rounding alone is
~1.7e-3 on Gaussian data) or computed from such (lm_head_loss dw), 2e-5 for f32 outputs (sums in
another order), 2e-2 for the MoE layer's outputs and gradients (a chain of bf16 roundings, as
tests/gpu/moe_gpu_test.cc bounds its experts), and 0 for the chosen experts (the mismatching
fraction). Prints one line per tensor; exits non-zero on a failed run or an error past its
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

BF16_TOL, F32_TOL, MOE_TOL, EXACT = 5e-3, 2e-5, 2e-2, 0.0
# Stored as i64; "c" stays f32; the rest is bf16.
INTEGERS = ("cu_seqlens", "ids", "targets", "block_table", "context_lens", "cu_seqlens_q",
            "cu_seqlens_k", "offsets")


def rel_rms(got, want):
    num = sum((a - b) ** 2 for a, b in zip(got, want))
    den = sum(b * b for b in want)
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def gauss(rng, shape, scale=1.0):
    n = 1
    for d in shape:
        n *= d
    return (shape, [scale * rng.gauss(0, 1) for _ in range(n)])


def mismatch(got, want):
    return sum(a != b for a, b in zip(got, want)) / max(len(want), 1)


def ints(rng, n, high):
    return ([n], [rng.randrange(high) for _ in range(n)])


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
        ("short_conv", ["--backward"],
         {"x": gauss(rng, [200, 96]), "w": gauss(rng, [96, 4], 0.5), "dy": gauss(rng, [200, 96]),
          "cu_seqlens": ([4], [0, 50, 130, 200])},
         {"y": BF16_TOL, "dx": BF16_TOL, "dw": F32_TOL}),
        ("attn_res", ["--backward"],
         {"sources": gauss(rng, [5, 128, 96]), "w": gauss(rng, [96]),
          "gamma": gauss(rng, [96], 0.2), "dh": gauss(rng, [128, 96])},
         {"h": BF16_TOL, "p": F32_TOL, "dsources": F32_TOL, "dw": F32_TOL, "dgamma": F32_TOL}),
        # MLA's training attention at full head size (qk 192, v 128), two documents.
        ("mla", ["--backward"],
         {"q": gauss(rng, [1, 96, 2, 192]), "k": gauss(rng, [1, 96, 2, 192]),
          "v": gauss(rng, [1, 96, 2, 128]), "do": gauss(rng, [1, 96, 2, 128]),
          "cu_seqlens": ([3], [0, 40, 96])},
         {"o": BF16_TOL, "lse": F32_TOL, "dq": BF16_TOL, "dk": BF16_TOL, "dv": BF16_TOL}),
        # MLA's keys and values at full size: Dn 128, Dv 128, Dr 64.
        ("mla_keys", ["--backward", "--attr", "nope_dim=128"],
         {"kv": gauss(rng, [64, 4, 256]), "kr": gauss(rng, [64, 64]),
          "dk": gauss(rng, [64, 4, 192]), "dv": gauss(rng, [64, 4, 128])},
         {"k": F32_TOL, "v": F32_TOL, "dkv": F32_TOL, "dkr": BF16_TOL}),
        ("sigmoid_gate", ["--backward"],
         {"x": gauss(rng, [4096]), "z": gauss(rng, [4096], 3.0), "dy": gauss(rng, [4096])},
         {"y": BF16_TOL, "dx": BF16_TOL, "dz": BF16_TOL}),
        # One Stable LatentMoE layer: N 64, D 48, E 8, top-2, L 24, F 32, a shared expert (Fs 32).
        ("moe", ["--backward", "--attr", "top_k=2", "--attr", "routed_scale=2.5"],
         {"x": gauss(rng, [64, 48]), "router": gauss(rng, [8, 48], 0.3),
          "down": gauss(rng, [24, 48], 0.2), "up": gauss(rng, [48, 24], 0.2),
          "experts.w1": gauss(rng, [8, 32, 24], 0.3), "experts.w3": gauss(rng, [8, 32, 24], 0.3),
          "experts.w2": gauss(rng, [8, 24, 32], 0.3), "latent_norm": gauss(rng, [24], 0.2),
          "shared.w1": gauss(rng, [32, 48], 0.2), "shared.w3": gauss(rng, [32, 48], 0.2),
          "shared.w2": gauss(rng, [48, 32], 0.2), "bias": gauss(rng, [8], 0.1),
          "dy": gauss(rng, [64, 48])},
         dict({"expert_ids": EXACT, "scores": F32_TOL},
              **{n: MOE_TOL for n in ["y", "dx", "drouter", "ddown", "dup", "dlatent_norm",
                                      "dexperts.w1", "dexperts.w3", "dexperts.w2", "dshared.w1",
                                      "dshared.w3", "dshared.w2"]})),
        ("embedding", ["--backward"],
         {"table": gauss(rng, [50, 64]), "ids": ints(rng, 200, 50), "dy": gauss(rng, [200, 64])},
         {"y": F32_TOL, "dtable": F32_TOL}),
        ("lm_head_loss", ["--backward", "--attr", "chunk_rows=32"],
         {"x": gauss(rng, [70, 64]), "w": gauss(rng, [300, 64], 0.3),
          "targets": ints(rng, 70, 300), "mask": ([70], [float(i % 5 != 0) for i in range(70)]),
          "dloss_sum": ([1], [1.0 / 64])},
         {"loss_sum": F32_TOL, "dx": BF16_TOL, "dw": BF16_TOL}),
        # Absorbed MLA decode at K3's row (576 = 512 latent + 64 rope), 16 heads, 2 new tokens per
        # sequence, three sequences over shuffled 16-token pages (the first page shared by two),
        # split automatically and forced to 5 splits.
        ("mla_decode", ["--attr", "dv=512"],
         {"q": gauss(rng, [3, 2, 16, 576], 2.0), "pages": gauss(rng, [12, 16, 576]),
          "block_table": ([3, 5], [7, 2, 11, 0, 5, 7, 0, 0, 0, 0, 3, 9, 1, 0, 0]),
          "context_lens": ([3], [70, 2, 33])},
         {"o": BF16_TOL, "lse": F32_TOL}),
        ("mla_decode", ["--attr", "dv=512", "--attr", "max_splits=5"],
         {"q": gauss(rng, [3, 2, 16, 576], 2.0), "pages": gauss(rng, [12, 16, 576]),
          "block_table": ([3, 5], [7, 2, 11, 0, 5, 7, 0, 0, 0, 0, 3, 9, 1, 0, 0]),
          "context_lens": ([3], [70, 2, 33])},
         {"o": BF16_TOL, "lse": F32_TOL}),
        # Prefix-causal attention at MLA's full head size (qk 192, v 128: the tensor-core kernel),
        # three sequences: 70 new tokens after 60 cached, one decode-like query after 89, a
        # sequence that is all new (40 of 40).
        ("mla_prefill", [],
         {"q": gauss(rng, [111, 2, 192], 2.0), "k": gauss(rng, [260, 2, 192]),
          "v": gauss(rng, [260, 2, 128]), "cu_seqlens_q": ([4], [0, 70, 71, 111]),
          "cu_seqlens_k": ([4], [0, 130, 220, 260])},
         {"o": BF16_TOL, "lse": F32_TOL}),
        # The experts' grouped products: 5 experts of 40 x 72, ragged rows (one expert empty, the
        # last 10 rows in none), forward and both gradients; f32 sums of the same bf16 values.
        ("grouped_gemm", ["--backward"],
         {"x": gauss(rng, [300, 72]), "w": gauss(rng, [5, 40, 72]),
          "offsets": ([6], [0, 70, 70, 150, 200, 290]), "dy": gauss(rng, [300, 40])},
         {"y": F32_TOL, "dx": F32_TOL, "dw": F32_TOL}),
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (op, args, tensors, tolerances) in enumerate(cases):
            src = os.path.join(tmp, "in%d.safetensors" % i)
            # c (the f32 accumulator of the weight-gradient form) stays f32.
            io.write_safetensors(src, tensors, "F32",
                                 {n: "I64" if n in INTEGERS else "BF16" for n in tensors
                                  if n != "c"})
            got = {}
            for device in ("cuda", "cpu"):
                out = os.path.join(tmp, "%s%d.safetensors" % (device, i))
                io.run(orrery, ["--op", op, "--in", src, "--out", out, "--device", device] + args)
                got[device] = io.read_safetensors(out)
            for name, tol in tolerances.items():
                compare = mismatch if tol == EXACT else rel_rms
                err = compare(got["cuda"][name][1], got["cpu"][name][1])
                ok = err <= tol
                failed += not ok
                print("ops run %-12s %s cuda vs cpu: %-12s %s %.2e (tolerance %.0e) %s"
                      % (op, " ".join(args), name, "mismatch" if tol == EXACT else "rel RMS",
                         err, tol, "ok" if ok else "FAILED"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
