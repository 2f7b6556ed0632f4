"""GPU tier of the speed path's P encoding (p="expcast", kernels/csrc/p_encoding.cuh): both kernels
against the reference emulation on random and video-like data (skips without a GPU).

Same gate as the kernel suites: relative L2 against the float64 emulation <= 1e-3 above the output
dtype's own rounding. On long video-like rows the corrected encoding and the paper's differ by
several times the gate, so "closer to the spec than to the paper" proves the kernel runs the new one.
"""
import pytest
import torch

from vc_attention.kernels import backend_mma, backend_sm90, backends, reference
from vc_attention.kernels.config import SPEED
from vc_attention.study.fidelity import grouping_permutation
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.study.videodata import video_like_qkv

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)"),
]

GATE = 1e-3
PAPER = SPEED.with_(p="expcast_paper")


def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


KERNELS = [
    pytest.param(backend_mma, id="mma"),
    pytest.param(backend_sm90, id="sm90", marks=pytest.mark.skipif(not _is_hopper(), reason="needs sm_90")),
]


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _random_qkv(n, d, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, d, generator=gen, device="cuda") for _ in range(3))
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")
    return q.to(dtype), k.to(dtype), v.to(dtype)


BACKEND_NAMES = {backend_mma: "mma", backend_sm90: "sm90"}


def _run(kernel, q, k, v, perm, config=SPEED):
    ops = prepare_cuda(q, k, v, perm, config, "bhnd")
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    return kernel.attention_from_operands(ops, config, out, "bhnd")


def _emulation(kernel, q, k, v, perm, config):
    """The float64 emulation of `kernel` with `config`'s P encoding, stepped as the kernel that ran (SPEED,
    the only mode these tests run) steps its online softmax: the paper contrast changes the encoding only."""
    step = backends.get(BACKEND_NAMES[kernel]).softmax_step(q.shape[-1], SPEED)
    return reference.vc_attention_reference(q, k, v, config, perm=perm, parts=True, offset_block=step).out


def _check(out, ref64):
    assert torch.isfinite(out).all()
    floor = _rel_l2(ref64.to(out.dtype), ref64)
    err = _rel_l2(out, ref64)
    assert err <= floor + GATE, f"rel-L2 to the emulation {err:.2e} > floor {floor:.2e} + {GATE}"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n,d,dtype", [(77, 64, torch.float16), (4097, 128, torch.bfloat16), (32760, 128, torch.bfloat16)])
def test_random_data_matches_the_spec(kernel, n, d, dtype):
    q, k, v = _random_qkv(n, d, dtype, seed=n)
    perm = torch.argsort(torch.rand(1, 2, n, device="cuda"), dim=-1)
    _check(_run(kernel, q, k, v, perm), _emulation(kernel, q, k, v, perm, SPEED))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d", [64, 128])
def test_video_like_data_matches_the_spec_not_the_paper(kernel, d):
    """21 x 30 x 52 tokens (N = 32,760, Wan2.1-480p-like): many scores sit below u = -14."""
    q, k, v = video_like_qkv(B=1, H=2, T=21, Hgrid=30, Wgrid=52, D=d, dtype=torch.bfloat16, device="cuda")
    perm = grouping_permutation(v, 64, 2)
    out = _run(kernel, q, k, v, perm)
    spec, paper = _emulation(kernel, q, k, v, perm, SPEED), _emulation(kernel, q, k, v, perm, PAPER)
    _check(out, spec)
    assert _rel_l2(out, spec) < 0.5 * _rel_l2(out, paper)


@pytest.mark.parametrize("name", ["mma", pytest.param("sm90", marks=pytest.mark.skipif(not _is_hopper(), reason="needs sm_90"))])
def test_the_paper_encoding_is_left_to_the_reference(name):
    q, _, _ = _random_qkv(64, 128, torch.bfloat16, seed=0)
    assert backends.get(name).why_not(q, SPEED, "bhnd") is None
    reason = backends.get(name).why_not(q, PAPER, "bhnd")
    assert reason is not None and "'expcast_paper' is not implemented" in reason
    assert backends.select(q, PAPER, "bhnd").name == "reference"
