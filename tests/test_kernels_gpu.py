"""GPU tier of the kernel tests: the `mma` backend against reference.py (skips without a GPU).

The same quantization on both sides, so the gate is tight (relative L2 <= 1e-3 against the
emulation); the fp64 exact attention bounds the total error. Outputs are poisoned with NaN first.
"""
import math

import pytest
import torch

from vc_attention.kernels import api, backend_mma, backends, reference
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.layout import from_bhnd, to_bhnd
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.kernels.prepare_reference import prepare_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)"),
]

CONFIGS = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT, "fp8qk": VCConfig(qk="fp8")}
GATE = 1e-3


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _qkv(b, h, n, d, dtype, layout, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, h, n, d) if layout == "bhnd" else (b, n, h, d)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda") for _ in range(3))
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _reference(q, k, v, perm, config, layout):
    """The emulation on contiguous (B,H,N,D) copies, returned in `layout` (reference.block_absmax
    views its input, which fails on a strided bnhd view when N is a multiple of the block)."""
    qb, kb, vb = (to_bhnd(t, layout).contiguous() for t in (q, k, v))
    return from_bhnd(reference.vc_attention_reference(qb, kb, vb, config, perm=perm), layout)


def _within_gate(out, q, k, v, perm, config, layout):
    """rel-L2 vs the emulation <= 1e-3, measured against its float64 output; a bf16 output may add
    its own rounding (2^-9 relative, about the size of the gate itself) on top."""
    qb, kb, vb = (to_bhnd(t, layout).contiguous() for t in (q, k, v))
    ref64 = reference.vc_attention_reference(qb, kb, vb, config, perm=perm, parts=True).out
    rounding = _rel_l2(ref64.to(q.dtype), ref64) if q.dtype == torch.bfloat16 else 0.0
    return _rel_l2(to_bhnd(out, layout), ref64) <= GATE + rounding


def _mma(q, k, v, perm, config, layout):
    ops = prepare_cuda(q, k, v, perm, config, layout)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    return backend_mma.attention_from_operands(ops, config, out, layout)


def _exact(q, k, v, layout, chunk=2048):
    qb, kb, vb = (to_bhnd(t, layout).double() for t in (q, k, v))
    scale = 1.0 / math.sqrt(qb.shape[-1])
    parts = [torch.softmax(qb[:, :, i:i + chunk] @ kb.transpose(-1, -2) * scale, -1) @ vb for i in range(0, qb.shape[2], chunk)]
    return from_bhnd(torch.cat(parts, dim=2), layout)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n", [1, 77, 128, 129, 4097])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16), (128, torch.float16)])
def test_matches_reference(name, n, layout, d, dtype):
    config = CONFIGS[name]
    q, k, v = _qkv(2, 2, n, d, dtype, layout, seed=n)
    perm = torch.argsort(torch.rand(2, 2, n, device="cuda"), dim=-1) if config.v == "vsmooth" else None
    out = _mma(q, k, v, perm, config, layout)
    assert torch.isfinite(out).all()
    assert _within_gate(out, q, k, v, perm, config, layout)
    exact = _exact(q, k, v, layout)
    assert _rel_l2(out, exact) <= 1.5 * _rel_l2(_reference(q, k, v, perm, config, layout), exact) + 1e-3


@pytest.mark.parametrize("n", [32760, 75600])
def test_long_sequences(n):
    q, k, v = _qkv(1, 2, n, 128, torch.bfloat16, "bnhd", seed=1)
    out = _mma(q, k, v, None, SPEED, "bnhd")
    assert _within_gate(out, q, k, v, None, SPEED, "bnhd")


def test_video_like_data_with_grouping():
    from vc_attention.study.fidelity import grouping_permutation
    from vc_attention.study.videodata import video_like_qkv

    q, k, v = video_like_qkv(B=2, H=2, T=4, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, device="cuda")
    perm = grouping_permutation(v, 64, 8)
    for config in (FIDELITY, SPEED):
        out = _mma(q, k, v, perm, config, "bhnd")
        assert _within_gate(out, q, k, v, perm, config, "bhnd")


def test_prepare_matches_contract():
    q, k, v = _qkv(2, 3, 1000, 128, torch.bfloat16, "bnhd", seed=3)
    perm = torch.argsort(torch.rand(2, 3, 1000, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, FIDELITY, "bnhd")
    want = prepare_reference(q, k, v, perm, FIDELITY, "bnhd")
    assert torch.equal(got.q_q, want.q_q)
    # scales: amax / 127 is a true division in the kernel and on the CPU reference, while torch on
    # CUDA multiplies by the rounded reciprocal: one ulp apart at most
    torch.testing.assert_close(got.q_scale, want.q_scale, rtol=2.5e-7, atol=0)
    # K mean and V block means are float32 sums in another order: allow rare one-code differences
    for field in ("k_q", "v_t"):
        same = (getattr(got, field).view(torch.uint8) == getattr(want, field).view(torch.uint8)).float().mean()
        assert same > 0.999
    torch.testing.assert_close(got.k_scale, want.k_scale, rtol=1e-6, atol=0)
    torch.testing.assert_close(got.v_scale, want.v_scale, rtol=1e-6, atol=0)


def test_lse_output():
    q, k, v = _qkv(1, 2, 300, 64, torch.float16, "bhnd")
    config = PLAIN_8BIT.with_(smooth_k=False)  # K smoothing shifts the LSE (see attention_from_operands)
    ops = prepare_cuda(q, k, v, None, config)
    lse = torch.full((1, 2, 300), float("nan"), device="cuda")
    backend_mma.attention_from_operands(ops, config, torch.empty_like(q), "bhnd", lse=lse)
    exact = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) / 8.0, dim=-1)
    assert (lse.double() - exact).abs().max() < 0.05


def test_64bit_offsets():
    """B*H*N*D > 2^31 elements: the last head must still be right."""
    b, h, n, d = 1, 104, 163840, 128
    assert b * h * n * d > 2**31
    q, k, v = _qkv(b, h, n, d, torch.bfloat16, "bnhd", seed=2)
    out = _mma(q, k, v, None, PLAIN_8BIT, "bnhd")
    last = slice(h - 1, h)
    assert _within_gate(out[:, :, last], q[:, :, last], k[:, :, last], v[:, :, last], None, PLAIN_8BIT, "bnhd")


def test_public_op_runs_on_mma():
    """Fails if the call silently ran elsewhere (e.g. the reference emulation)."""
    q, k, v = _qkv(1, 2, 256, 128, torch.bfloat16, "bhnd")
    before = api.BACKEND_CALLS["mma"]
    out = api.vc_attention(q, k, v, config=SPEED, backend="mma")
    assert api.BACKEND_CALLS["mma"] == before + 1
    assert _within_gate(out, q, k, v, None, SPEED, "bhnd")
    assert not backends.select(q, SPEED, "bhnd", allow_slow=False).slow


def test_bench_runs_every_method_on_mma():
    from vc_attention.commands import bench

    result = bench.benchmark({"small": (1, 2, 1024, 128)}, backend="mma", reps=1, fidelity=False)
    methods = {r["method"]: r for r in result["rows"]}
    assert {"sdpa-cudnn", "sdpa-flash", "vc-plain8", "vc-fidelity", "vc-speed"} <= set(methods)
    assert all(methods[m]["backend"] == "mma" and methods[m]["ms"] > 0 for m in ("vc-plain8", "vc-fidelity", "vc-speed"))
