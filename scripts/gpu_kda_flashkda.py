#!/usr/bin/env python3
"""Times FlashKDA's forward (MoonshotAI/FlashKDA, `flash_kda.fwd`) on the GPU machine, as a second
anchor beside fla for docs/benchmarks.md.

FlashKDA is forward-only (inference): 16-token chunks, a token-parallel preparation kernel and a
head-parallel recurrence kernel with its state in bf16, the gate activation, q/k L2 norm and beta
sigmoid in the kernel. Its package is never committed: put a built copy on PYTHONPATH. The inputs
are gpu_kda_fla.py's (raw bf16 q, k, v, gate pre-activation g with A_log = dt_bias = 0, beta
logits, lower_bound = -5), so the figure compares with fla's forward and with Orrery's
`transforms-in-op` forward. First FlashKDA's output and final state are checked against the fp64
token-by-token recurrence (spec §2.3) at a small shape, so that what is timed is a working kernel.
Prints one line per shape:
  flashkda B=<b> T=<t> H=<h> K=V=<d> fwd_ms=<median> fwd_final_state_ms=<median>
"""
import sys

import torch
import triton.testing

import flash_kda

from gpu_kda_fla import parse_shapes


def naive_recurrence(q, k, v, g, beta, a_log, dt_bias, lower_bound, scale):
    """Spec §2.2-§2.3 in fp64 from the raw inputs: o [B, T, H, V], final state [B, H, K, V]."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    q = q * (q.square().sum(-1, keepdim=True) + 1e-6).rsqrt()
    k = k * (k.square().sum(-1, keepdim=True) + 1e-6).rsqrt()
    gate = lower_bound * torch.sigmoid(a_log.double().exp()[:, None] * (g + dt_bias.double()))
    beta = torch.sigmoid(beta)
    b, t, h, d = q.shape
    s = torch.zeros(b, h, d, v.shape[-1], dtype=torch.float64, device=q.device)
    o = torch.empty(b, t, h, v.shape[-1], dtype=torch.float64, device=q.device)
    for i in range(t):
        s = s * gate[:, i].exp()[..., None]
        u = beta[:, i, :, None] * (v[:, i] - torch.einsum("bhkv,bhk->bhv", s, k[:, i]))
        s = s + k[:, i, :, :, None] * u[:, :, None, :]
        o[:, i] = torch.einsum("bhkv,bhk->bhv", s, scale * q[:, i])
    return o, s


def check_against_recurrence():
    """FlashKDA's o and fp32 final state at (2, 200, 3, 128), T not a multiple of its 16-token
    chunk, against naive_recurrence; raises when either is off."""
    torch.manual_seed(1)
    b, t, h, d = 2, 200, 3, 128
    q, k, v, g = (torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    beta = torch.randn(b, t, h, device="cuda", dtype=torch.bfloat16)
    a_log = torch.rand(h, device="cuda") - 0.5
    dt_bias = torch.rand(h, d, device="cuda") - 0.5
    out = torch.empty_like(v)
    final = torch.empty(b, h, d, d, device="cuda", dtype=torch.float32)
    flash_kda.fwd(q, k, v, g, beta, d ** -0.5, out, a_log, dt_bias, -5.0, final_state=final)
    o_ref, s_ref = naive_recurrence(q, k, v, g, beta, a_log, dt_bias, -5.0, d ** -0.5)
    # FlashKDA's final state is [N, H, V, K] (its transposed layout).
    s_got = final.double().transpose(-1, -2)
    for name, got, ref in (("o", out.double(), o_ref), ("final state", s_got, s_ref)):
        rel = ((got - ref).norm() / ref.norm()).item()
        print(f"flashkda check {name}: relative error {rel:.3g} against the fp64 recurrence",
              flush=True)
        # bf16 inputs rounded as both sides see them; FlashKDA rounds its operands and its state
        # to bf16 (fla's tolerances for bf16 outputs are of this order, spec §2.8).
        if not rel < 2e-2:
            raise SystemExit(f"gpu_kda_flashkda.py: FlashKDA's {name} is off by {rel:.3g} "
                             "(expected < 2e-2): not timing it")


def main():
    shapes = parse_shapes(sys.argv[1:])
    torch.manual_seed(0)
    dev = "cuda"
    check_against_recurrence()
    for (b, t, h, d) in shapes:
        q = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16)
        g = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16)
        beta = torch.randn(b, t, h, device=dev, dtype=torch.bfloat16)
        a_log = torch.zeros(h, device=dev, dtype=torch.float32)
        dt_bias = torch.zeros(h, d, device=dev, dtype=torch.float32)
        out = torch.empty_like(v)
        final = torch.empty(b, h, d, d, device=dev, dtype=torch.float32)
        scale = d ** -0.5

        def fwd():
            flash_kda.fwd(q, k, v, g, beta, scale, out, a_log, dt_bias, -5.0)

        def fwd_final():
            flash_kda.fwd(q, k, v, g, beta, scale, out, a_log, dt_bias, -5.0, final_state=final)

        with torch.no_grad():
            f_ms = triton.testing.do_bench(fwd, warmup=50, rep=300, return_mode="median")
            ff_ms = triton.testing.do_bench(fwd_final, warmup=50, rep=300, return_mode="median")
        print(f"flashkda B={b} T={t} H={h} K=V={d} fwd_ms={f_ms:.3f} fwd_final_state_ms={ff_ms:.3f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
