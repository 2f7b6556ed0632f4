"""GPU tier of V-Smooth's low-rank V term (VCConfig.v_rank) in the CUDA prepare and the Hopper kernel.

The CUDA prepare must write the operand contract's low-rank fields as prepare_reference does (up to
float32 summation order); the sm90 kernel must compute from them what the float64 operand emulation
computes, and the public op what the reference emulation computes with the same basis. Outputs are
poisoned with NaN first; a kernel that ignored the extra columns fails the emulation gate (the term
moves the output by far more than the gate).

  pytest -q -m gpu tests/test_lowrank_gpu.py
"""
import dataclasses

import pytest
import torch

from vc_attention.kernels import api, backends, reference
from vc_attention.kernels.config import FIDELITY as FIDELITY_PRESET, SPEED, VCConfig
from vc_attention.kernels.layout import shape_in, to_bhnd
from vc_attention.kernels.operand_emulation import emulate_attention
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.kernels.prepare_reference import prepare_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# the low-rank V term's kernels take neither refinement (the op drops them there): the preset without them
FIDELITY = FIDELITY_PRESET.without_refinements()

GATE = 1e-3
MODES = {"fidelity": FIDELITY, "speed": SPEED}


def _sm90():
    backend = backends.get("sm90")
    if backend.availability():
        pytest.skip(f"sm90: {backend.availability()}")
    return backend


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _structured_qkv(b, h, n, d, dtype, layout, seed):
    """q, k random; v with channel offsets, drift and a strong low-rank residual (what the term takes)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(shape_in(layout, b, h, n, d), generator=gen, device="cuda") for _ in range(2))
    directions = torch.linalg.qr(torch.randn(d, 4, generator=gen, device="cuda")).Q.T
    coeffs = torch.randn(b, h, n, 4, generator=gen, device="cuda") * torch.tensor([3.0, 2.0, 1.0, 0.5], device="cuda")
    v = 2.0 * torch.randn(d, generator=gen, device="cuda") + coeffs @ directions + 0.1 * torch.randn(b, h, n, d, generator=gen, device="cuda")
    v = v if layout == "bhnd" else v.transpose(1, 2)
    return q.to(dtype), (2.0 * k).to(dtype), v.contiguous().to(dtype)


def _perm(b, h, n):
    return torch.argsort(torch.rand(b, h, n, device="cuda"), dim=-1)


def _basis(v, perm, layout, rank):
    return reference.lowrank_basis(reference.permute_tokens(to_bhnd(v, layout), perm), rank)


@pytest.mark.parametrize("rank", [1, 6])
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_prepare_writes_the_low_rank_contract(rank, d):
    q, k, v = _structured_qkv(2, 3, 1000, d, torch.bfloat16, "bnhd", seed=3)
    perm = _perm(2, 3, 1000)
    config = FIDELITY.with_rank(rank)
    basis = _basis(v, perm, "bnhd", rank)
    got = prepare_cuda(q, k, v, perm, config, "bnhd", basis=basis)
    want = prepare_reference(q, k, v, perm, config, "bnhd", basis=basis)
    assert got.v_low_t.shape == want.v_low_t.shape == (2, 3, 8, 1024)
    assert torch.equal(got.v_low_basis, basis)
    # the parity rows exactly; the codes up to rare one-code differences (float32 dot products and K
    # mean sums in another order)
    assert torch.equal(got.v_low_t[:, :, :2].view(torch.uint8), want.v_low_t[:, :, :2].view(torch.uint8))
    same = (got.v_low_t.view(torch.uint8) == want.v_low_t.view(torch.uint8)).float().mean()
    assert same > 0.999
    assert not got.v_low_t[:, :, 2 + rank:].view(torch.uint8).any()
    torch.testing.assert_close(got.v_low_scale, want.v_low_scale, rtol=1e-5, atol=0)
    torch.testing.assert_close(got.v_scale, want.v_scale, rtol=1e-5, atol=0)  # the residual's bound
    assert (got.v_t.view(torch.uint8) == want.v_t.view(torch.uint8)).float().mean() > 0.999


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [77, 128, 300, 4097])  # one tile; the tail tile alone after pairs; odd/even tiles
@pytest.mark.parametrize("layout,dtype", [("bhnd", torch.bfloat16), ("bnhd", torch.float16)])
def test_sm90_kernel_matches_the_operand_emulation(mode, n, layout, dtype):
    backend = _sm90()
    config = MODES[mode].with_rank(6)
    q, k, v = _structured_qkv(1, 3, n, 128, dtype, layout, seed=n)
    perm = _perm(1, 3, n)
    ops = prepare_cuda(q, k, v, perm, config, layout, basis=_basis(v, perm, layout, 6))
    out = backend.attend(ops, config, torch.full(q.shape, float("nan"), dtype=dtype, device="cuda"), layout)
    out = to_bhnd(out, layout)
    assert torch.isfinite(out).all()
    step = backend.softmax_step(128, config)  # the exact emulation of the kernel's online-softmax step
    ref64 = emulate_attention(ops, config, torch.float64, step)
    floor = _rel_l2(ref64.to(dtype), ref64)
    assert _rel_l2(out, ref64) <= floor + GATE
    # the term matters: without it the same operands give a clearly different output
    dropped = dataclasses.replace(ops, v_low_t=None, v_low_scale=None, v_low_basis=None)
    assert _rel_l2(emulate_attention(dropped, config, torch.float64, step), ref64) > 4 * (floor + GATE)


@pytest.mark.parametrize("mode", MODES)
def test_public_op_runs_the_term_on_sm90(mode):
    backend = _sm90()
    config = MODES[mode].with_rank(6)
    q, k, v = _structured_qkv(1, 2, 2000, 128, torch.bfloat16, "bhnd", seed=11)
    perm = _perm(1, 2, 2000)
    basis = _basis(v, perm, "bhnd", 6)
    before = api.BACKEND_CALLS.copy()
    out = api.vc_attention(q, k, v, config=config, perm=perm, v_basis=basis, backend="auto")
    assert api.BACKEND_CALLS - before == {"sm90": 1}
    ref = reference.vc_attention_reference(q, k, v, config, perm=perm, parts=True, v_basis=basis,
                                           offset_block=backend.softmax_step(128, config)).out
    floor = _rel_l2(ref.to(out.dtype), ref)
    assert _rel_l2(out, ref) <= floor + GATE
    # and closer to exact attention than rank 0 on V with a low-rank residual
    exact = reference.exact_attention(q.double(), k.double(), v.double())
    plain = api.vc_attention(q, k, v, config=MODES[mode], perm=perm)
    assert _rel_l2(out, exact) < _rel_l2(plain, exact)


def test_without_a_basis_the_op_computes_the_reference_one():
    _sm90()
    config = FIDELITY.with_rank(3)
    q, k, v = _structured_qkv(1, 2, 700, 128, torch.float16, "bnhd", seed=4)
    perm = _perm(1, 2, 700)
    auto = api.vc_attention(q, k, v, layout="bnhd", config=config, perm=perm)
    given = api.vc_attention(q, k, v, layout="bnhd", config=config, perm=perm, v_basis=_basis(v, perm, "bnhd", 3))
    assert torch.equal(auto, given)


def test_the_builds_low_rank_cases_are_the_declared_ones():
    backend = _sm90()
    from vc_attention.kernels import backend_sm90

    ext = backend_sm90.extension()
    for d in (64, 128):
        for expcast in (False, True):
            for vsmooth in (False, True):
                q = torch.empty(1, 1, 8, d, device="cuda", dtype=torch.float16)
                config = VCConfig(p="expcast" if expcast else "exp2", v="vsmooth" if vsmooth else "per_channel",
                                  v_rank=2 if vsmooth else 0)
                declared = vsmooth and backend.why_not(q, config, "bhnd") is None
                assert bool(ext.low_rank(d, expcast, vsmooth)) == declared, (d, expcast, vsmooth)


def test_head_dim_64_with_a_rank_is_declined_with_its_reason():
    backend = _sm90()
    q = torch.empty(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    reason = backend.why_not(q, FIDELITY.with_rank(6), "bhnd")
    assert reason is not None and "head dim 64" in reason
