#!/usr/bin/env python3
"""`orrery ops run --op kda` on a file written by another tool.

This script is that other tool: it writes safetensors with its own writer (struct + json, standard
library only), runs the orrery binary, reads the outputs back and compares them with its own naive
KDA recurrence (spec/model.md §2.3, in Python floats = f64):
  * forward (f32 file, chunked with C = 16 and the recurrent op): o and final_state;
  * backward (f64 file): dq, dk, dv, dg, dbeta, dinitial_state against central finite differences
    of L = sum(o * do) + sum(final_state * dfinal_state) through the Python recurrence;
  * bad input: a missing tensor and a wrong shape give one line on stderr and a non-zero exit.
Usage: ops_kda_test.py PATH/TO/orrery
"""
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

FORMATS = {"F32": ("f", 4), "F64": ("d", 8), "I64": ("q", 8), "I32": ("i", 4), "BF16": ("H", 2)}


def bf16_bits(x):
    """The bf16 nearest to x (ties to even), as its 16-bit pattern."""
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def write_safetensors(path, tensors, dtype="F32", dtypes=None):
    """tensors: name -> (shape, flat list); every tensor stored as `dtype`, or as dtypes[name]."""
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        dt = "I64" if name == "cu_seqlens" else (dtypes or {}).get(name, dtype)
        code, size = FORMATS[dt]
        if dt == "BF16":
            values = [bf16_bits(v) for v in values]
        blob = struct.pack("<%d%s" % (len(values), code), *values)
        header[name] = {"dtype": dt, "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        code, size = FORMATS[e["dtype"]]
        b, end = e["data_offsets"]
        raw = data[8 + n + b:8 + n + end]
        out[name] = (e["shape"], list(struct.unpack("<%d%s" % (len(raw) // size, code), raw)))
    return out


def problem(rng, B, T, H, K, V):
    def normal(n):
        return [rng.gauss(0, 1) for _ in range(n)]

    q, k = normal(B * T * H * K), normal(B * T * H * K)
    for x in (q, k):  # L2-normalise per (b, t, h) row, as the layer does
        for r in range(B * T * H):
            row = x[r * K:(r + 1) * K]
            norm = math.sqrt(sum(a * a for a in row))
            x[r * K:(r + 1) * K] = [a / norm for a in row]
    g = [-5.0 / (1.0 + math.exp(-rng.gauss(0, 1.5))) for _ in range(B * T * H * K)]  # in (-5, 0)
    beta = [1.0 / (1.0 + math.exp(-rng.gauss(0, 1))) for _ in range(B * T * H)]
    return {
        "q": ([B, T, H, K], q), "k": ([B, T, H, K], k), "v": ([B, T, H, V], normal(B * T * H * V)),
        "g": ([B, T, H, K], g), "beta": ([B, T, H], beta),
        "initial_state": ([B, H, K, V], [0.3 * a for a in normal(B * H * K * V)]),
    }


def naive_kda(t):
    """The recurrence of spec §2.3 per (b, h): returns o [B,T,H,V] and final_state [B,H,K,V]."""
    B, T, H, K = t["q"][0]
    V = t["v"][0][3]
    q, k, v, g, beta, h0 = (t[n][1] for n in ("q", "k", "v", "g", "beta", "initial_state"))
    scale = K ** -0.5
    o = [0.0] * (B * T * H * V)
    final = [0.0] * (B * H * K * V)
    for b in range(B):
        for h in range(H):
            S = [[h0[((b * H + h) * K + i) * V + j] for j in range(V)] for i in range(K)]
            for s in range(T):
                base = (b * T + s) * H + h
                kk, qq = k[base * K:(base + 1) * K], q[base * K:(base + 1) * K]
                gg, vv, bb = g[base * K:(base + 1) * K], v[base * V:(base + 1) * V], beta[base]
                for i in range(K):
                    a = math.exp(gg[i])
                    S[i] = [x * a for x in S[i]]
                u = [bb * (vv[j] - sum(S[i][j] * kk[i] for i in range(K))) for j in range(V)]
                for i in range(K):
                    S[i] = [S[i][j] + kk[i] * u[j] for j in range(V)]
                for j in range(V):
                    o[base * V + j] = sum(S[i][j] * qq[i] for i in range(K)) * scale
            for i in range(K):
                for j in range(V):
                    final[((b * H + h) * K + i) * V + j] = S[i][j]
    return o, final


def run(orrery, args, expect_ok=True):
    r = subprocess.run([orrery, "ops", "run"] + args, capture_output=True, text=True, timeout=60)
    if expect_ok and r.returncode != 0:
        sys.exit("orrery ops run %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr))
    return r


def max_rel(a, b):
    scale = max(1.0, max(abs(x) for x in b))
    return max(abs(x - y) for x, y in zip(a, b)) / scale


def main():
    orrery = sys.argv[1]
    rng = random.Random(7)
    tmp = tempfile.mkdtemp(prefix="orrery_ops_")
    failures = []

    # Forward: f32 file, T = 37 crosses two chunk boundaries at C = 16.
    t = problem(rng, B=2, T=37, H=2, K=8, V=6)
    o_ref, final_ref = naive_kda(t)
    write_safetensors(os.path.join(tmp, "fwd.safetensors"), t, "F32")
    for op, attrs in (("kda", ["--attr", "chunk_size=16"]), ("kda", []), ("kda_recurrent", [])):
        out = os.path.join(tmp, "out_%s.safetensors" % op)
        run(orrery, ["--op", op, "--in", os.path.join(tmp, "fwd.safetensors"), "--out", out] + attrs)
        got = read_safetensors(out)
        e_o = max_rel(got["o"][1], o_ref)
        e_s = max_rel(got["final_state"][1], final_ref)
        print("%-13s %-16s forward: o err %.2e, final_state err %.2e" % (op, " ".join(attrs), e_o, e_s))
        # f32 inputs against an f64 recurrence over 37 steps: f32 rounding (~1e-7 per op).
        if e_o > 2e-5 or e_s > 2e-5 or got["o"][0] != [2, 37, 2, 6] or got["final_state"][0] != [2, 2, 8, 6]:
            failures.append("%s forward" % op)

    # Backward: f64 file, gradients against finite differences of the Python recurrence.
    t = problem(rng, B=1, T=19, H=1, K=4, V=3)
    n_o, n_s = 19 * 3, 4 * 3
    t["do"] = ([1, 19, 1, 3], [rng.gauss(0, 1) for _ in range(n_o)])
    t["dfinal_state"] = ([1, 1, 4, 3], [rng.gauss(0, 1) for _ in range(n_s)])
    write_safetensors(os.path.join(tmp, "bwd.safetensors"), t, "F64")
    out = os.path.join(tmp, "bwd_out.safetensors")
    run(orrery, ["--op", "kda", "--backward", "--attr", "chunk_size=16", "--in",
                 os.path.join(tmp, "bwd.safetensors"), "--out", out])
    got = read_safetensors(out)

    def loss():
        o, s = naive_kda(t)
        return sum(a * b for a, b in zip(o, t["do"][1])) + sum(a * b for a, b in zip(s, t["dfinal_state"][1]))

    worst = 0.0
    for name in ("q", "k", "v", "g", "beta", "initial_state"):
        values = t[name][1]
        grad = got["d" + name][1]
        for i in range(0, len(values), max(1, len(values) // 6)):
            old, h = values[i], 1e-6
            values[i] = old + h
            lp = loss()
            values[i] = old - h
            lm = loss()
            values[i] = old
            fd = (lp - lm) / (2 * h)
            err = abs(fd - grad[i]) / max(1.0, abs(fd))
            worst = max(worst, err)
            if err > 1e-6:
                failures.append("d%s[%d]: orrery %.9g, finite difference %.9g" % (name, i, grad[i], fd))
    print("kda backward (f64): max relative error vs finite differences %.2e" % worst)

    # Bad input: one line on stderr, non-zero exit, no output file.
    bad = dict(problem(rng, B=1, T=5, H=1, K=4, V=3))
    del bad["beta"]
    write_safetensors(os.path.join(tmp, "bad.safetensors"), bad, "F32")
    r = run(orrery, ["--op", "kda", "--in", os.path.join(tmp, "bad.safetensors"), "--out",
                     os.path.join(tmp, "bad_out.safetensors")], expect_ok=False)
    if r.returncode == 0 or "'beta'" not in r.stderr or len(r.stderr.strip().splitlines()) != 1:
        failures.append("missing beta: rc %d, stderr %r" % (r.returncode, r.stderr))
    bad = dict(problem(rng, B=1, T=5, H=1, K=4, V=3))
    bad["g"] = ([1, 5, 1, 3], bad["g"][1][:15])
    write_safetensors(os.path.join(tmp, "bad2.safetensors"), bad, "F32")
    r = run(orrery, ["--op", "kda", "--in", os.path.join(tmp, "bad2.safetensors"), "--out",
                     os.path.join(tmp, "bad_out.safetensors")], expect_ok=False)
    if r.returncode == 0 or "g" not in r.stderr or len(r.stderr.strip().splitlines()) != 1:
        failures.append("wrong shape of g: rc %d, stderr %r" % (r.returncode, r.stderr))
    print("bad input:", r.stderr.strip())
    if os.path.exists(os.path.join(tmp, "bad_out.safetensors")):
        failures.append("an output file was written for bad input")

    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("ops run kda: all checks passed")


if __name__ == "__main__":
    main()
