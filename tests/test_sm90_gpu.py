"""GPU tier of the Hopper backend `sm90` (skips without an sm_90 GPU).

The kernel runs on the prepare step's operands (the same quantization as reference.py), so the gate
is tight: relative L2 against the float64 emulation <= 1e-3 above the output dtype's own rounding
(the emulation rounded to bf16 already differs from itself in float64 by ~1e-3). Outputs are
poisoned with NaN first; the public-op test proves through BACKEND_CALLS that `sm90` ran.
"""
import pytest
import torch

from vc_attention.kernels import api, backend_sm90, backends, reference
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED
from vc_attention.kernels.layout import from_bhnd, to_bhnd
from vc_attention.kernels.prepare_cuda import prepare_cuda

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs a Hopper (sm_90) GPU"),
]

CONFIGS = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT}
GATE = 1e-3


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _qkv(b, h, n, d, dtype, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, h, n, d) if layout == "bhnd" else (b, n, h, d)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda") for _ in range(3))
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")  # channel offsets: what V-Smooth removes
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _emulation(q, k, v, perm, config, layout):
    """The float64 emulation in `layout` (computed on contiguous (B,H,N,D) copies)."""
    qb, kb, vb = (to_bhnd(t, layout).contiguous() for t in (q, k, v))
    parts = reference.vc_attention_reference(qb, kb, vb, config, perm=perm, parts=True)
    return from_bhnd(parts.out, layout)


def _sm90(q, k, v, perm, config, layout):
    ops = prepare_cuda(q, k, v, perm, config, layout)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    return backend_sm90.attention_from_operands(ops, config, out, layout)


def _check(out, ref):
    assert torch.isfinite(out).all()
    floor = _rel_l2(ref.to(out.dtype), ref)
    assert _rel_l2(out, ref) <= floor + GATE


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n", [1, 77, 128, 129, 4097])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16), (128, torch.float16)])
def test_matches_emulation(name, n, layout, d, dtype):
    config = CONFIGS[name]
    q, k, v = _qkv(2, 2, n, d, dtype, layout, seed=n)
    perm = torch.argsort(torch.rand(2, 2, n, device="cuda"), dim=-1) if config.v == "vsmooth" else None
    _check(_sm90(q, k, v, perm, config, layout), _emulation(q, k, v, perm, config, layout))


def test_long_sequence_speed_mode():
    q, k, v = _qkv(1, 2, 75600, 128, torch.bfloat16, "bnhd", seed=1)
    _check(_sm90(q, k, v, None, SPEED, "bnhd"), _emulation(q, k, v, None, SPEED, "bnhd"))


def test_a_wrong_result_fails_the_gate():
    q, k, v = _qkv(1, 2, 500, 128, torch.float16, "bhnd", seed=3)
    out = _sm90(q, k, v, None, FIDELITY, "bhnd")
    with pytest.raises(AssertionError):
        _check(out, _emulation(q, k, v, None, SPEED, "bhnd") * 1.01)


def test_public_op_dispatches_to_sm90():
    q, k, v = _qkv(2, 3, 300, 128, torch.bfloat16, "bnhd", seed=7)
    perm = torch.argsort(torch.rand(2, 3, 300, device="cuda"), dim=-1)
    assert backends.select(q, SPEED, "bnhd").name == "sm90"
    before = api.BACKEND_CALLS["sm90"]
    out = api.vc_attention(q, k, v, layout="bnhd", config=SPEED, perm=perm)
    assert api.BACKEND_CALLS["sm90"] == before + 1
    _check(out, _emulation(q, k, v, perm, SPEED, "bnhd"))


def test_fp8_qk_is_declined_with_a_reason():
    q, _, _ = _qkv(1, 1, 64, 128, torch.float16, "bhnd", seed=0)
    reason = backends.get("sm90").why_not(q, FIDELITY.with_(qk="fp8"), "bhnd")
    assert reason is not None and "FP8 QK" in reason
