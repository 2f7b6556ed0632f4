"""GPU tier of K scales per MMA lane (VCConfig.k_lane_scales, kernels/k_lanes.py): the CUDA prepare's K lanes kernel
(csrc/prepare_k_lanes.cuh: lane order, lane scales, V gathered in the same order) against the spec, and the Hopper
paired-K loops' KLANES kernels against the float64 emulation.

  pytest -q -m gpu tests/test_k_lanes_gpu.py
"""
import pytest
import torch

from vc_attention.kernels import backends, k_lanes, reference
from vc_attention.kernels.config import FIDELITY as FIDELITY_PRESET, SPEED
from vc_attention.kernels.constants import VSMOOTH_K_LANES, VSMOOTH_PAIRED_K
from vc_attention.kernels.operand_emulation import emulate_attention
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.kernels.prepare_reference import prepare_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# the lane kernels take neither refinement (the op drops them there): the preset without them
FIDELITY = FIDELITY_PRESET.without_refinements()

GATE = 1e-3  # tests/test_backends_gpu.py's: rel-L2 above the dtype's rounding of the float64 emulation
FIDELITY_LANES = FIDELITY.with_(k_lane_scales=True)
SPEED_LANES = SPEED.with_(k_lane_scales=True)


def _qkv(n: int, dtype, seed: int = 0, d: int = 128):
    """Random Q, K, V with key norms spread over a factor of 8 (what the lane order sorts by)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, d, generator=gen, device="cuda") for _ in range(3))
    k = k * torch.exp2(3 * torch.rand(1, 2, n, 1, generator=gen, device="cuda"))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("n", [300, 1000, 1100, 4097])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("smooth_k", [True, False])
@pytest.mark.parametrize("base", [SPEED_LANES, FIDELITY_LANES], ids=["speed", "fidelity"])
def test_cuda_prepare_writes_the_lane_operands_of_the_spec(n, dtype, smooth_k, base):
    """k_scale (B,H,n_pad/128,4), the lane-ordered K codes and V of the CUDA prepare are prepare_reference's (the K
    mean is a float32 sum in another order: scales within 1e-6, rare one-code differences, and a near-tie of two
    keys' amaxes may order them the other way: such rows are rare and the operands' output stays the spec's)."""
    config = base.with_(smooth_k=smooth_k)
    q, k, v = _qkv(n, dtype, seed=n)
    perm = torch.argsort(torch.rand(1, 2, n, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, config, "bhnd")
    want = prepare_reference(q, k, v, perm, config, "bhnd")
    slots = -(-n // 128)
    assert got.k_scale.shape == (1, 2, slots, 4)
    torch.testing.assert_close(got.k_scale, want.k_scale.to(got.k_scale.device), rtol=1e-6, atol=0)
    off = (got.k_q.float() - want.k_q.float()).abs()
    assert (off > 1).any(-1).float().mean() < 2e-3 and (off > 0).float().mean() < 1e-3  # swapped rows, one-code ties
    v_rows_off = (got.v_t.float() - want.v_t.float()).abs().amax(-2) > 0  # per token: only swapped rows differ
    assert v_rows_off.float().mean() < 2e-3
    emul_got = emulate_attention(got, config, torch.float32, 256)
    assert _rel_l2(emul_got, emulate_attention(want, config, torch.float32, 256)) < 1e-3


@pytest.mark.parametrize("n", [1000, 4097])
def test_the_lane_kernel_orders_each_full_block_and_scales_each_lane(n):
    """What makes lane scales pay, read from the CUDA operands alone: in every full 128-key block the keys' code
    amaxes times their lane's scale fall with the rank (lane_position), and every lane that has keys reaches code
    127 (its scale is its own amax): the K lanes kernel ran, not the per-block quantizer."""
    q, k, v = _qkv(n, torch.bfloat16, seed=3)
    ops = prepare_cuda(q, k, v, None, FIDELITY_LANES, "bhnd")
    codes = ops.k_q[:, :, :n].float().abs().amax(-1)  # (1,2,n)
    amax = codes * k_lanes.per_key(ops.k_scale, n)
    pos = k_lanes.lane_position(torch.arange(128, device="cuda"))
    for blk in range(n // 128):
        by_rank = amax[..., blk * 128 + pos]
        # descending up to the INT8 rounding of a row's own amax (half a code of its lane's scale)
        slack = k_lanes.per_key(ops.k_scale, n)[..., blk * 128 + pos] * 0.5
        assert (by_rank[..., 1:] <= by_rank[..., :-1] + slack[..., 1:] + slack[..., :-1]).all()
    lanes = k_lanes.key_lanes(n, "cuda")
    for pair in range(-(-n // 256)):
        for lane in range(4):
            keys = [j for j in range(pair * 256, min(n, pair * 256 + 256)) if lanes[j] == lane]
            if keys:
                assert (codes[..., keys].amax(-1) == 127).all()


def _sm90():
    backend = backends.get("sm90")
    if backend.availability():
        pytest.skip(f"sm90: {backend.availability()}")
    return backend


# even and odd tile counts (the odd tail runs alone); 4097 and 2053 end on a K-scale block with 1 and 5 keys, so some
# lanes have no valid key at all (scale 0, anchor INT_MIN: their masked keys must still get P 0)
@pytest.mark.parametrize("n", [3000, 1100, 75600 // 4, 4097, 2053])
@pytest.mark.parametrize("config", [SPEED_LANES, FIDELITY_LANES], ids=["speed", "fidelity"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_lane_kernels_match_their_emulation(n, config, dtype, sm90_kernel_flags):
    """vc_attention on sm90 with lane scales runs the KLANES kernel of its paired-K loop (profiler name) and matches
    the float64 emulation of the spec (each lane anchored at its own maximum in speed mode) within the gate."""
    from vc_attention.kernels import api

    _sm90()
    q, k, v = _qkv(n, dtype, seed=11)
    perm = torch.argsort(torch.rand(1, 2, n, device="cuda"), dim=-1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = api.vc_attention(q, k, v, config=config, perm=perm, backend="sm90")
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "vc_attention_sm90_kernel" in e.name]
    assert names and all(sm90_kernel_flags(nm)[3] for nm in names), names
    emul = reference.vc_attention_reference(q, k, v, config, perm=perm, parts=True, offset_block=256).out
    assert torch.isfinite(out).all() and _rel_l2(out, emul) <= _rel_l2(emul.to(dtype), emul) + GATE


@pytest.mark.parametrize("config", [SPEED_LANES, FIDELITY_LANES], ids=["speed", "fidelity"])
def test_the_lane_kernel_reads_each_lanes_scale(config):
    """The binding with the lane bit reads four scales per tile: halving one lane's scales changes the output, and the
    same operands with every lane's scale set to lane 0's run like one scale per tile would (finite, different)."""
    from vc_attention.kernels import backend_sm90

    _sm90()
    q, k, v = _qkv(2000, torch.bfloat16, seed=7)
    ops = prepare_cuda(q, k, v, None, config, "bhnd")
    mode = backend_sm90.vsmooth_mode(config)
    assert mode & VSMOOTH_K_LANES and mode & VSMOOTH_PAIRED_K

    def run(k_scale):
        o = torch.full_like(q, float("nan"))
        backend_sm90.extension().attention(ops.q_q, ops.q_scale, ops.k_q, k_scale, ops.v_t, ops.v_scale, ops.v_mean,
                                           None, None, None, o, ops.n_tokens, config.p == "expcast", mode,
                                           torch.cuda.current_stream().cuda_stream,
                                           ops.v_seg_end if (mode & 3) == 2 else None)
        return o

    base = run(ops.k_scale)
    assert torch.equal(run(ops.k_scale.clone()), base)
    lane2 = ops.k_scale.clone()
    lane2[..., 2] *= 0.5
    changed = run(lane2)
    assert torch.isfinite(changed).all() and not torch.equal(changed, base)
    with pytest.raises(ValueError, match="k_scale must be"):
        run(ops.k_scale[..., 0].contiguous())


def test_prepare_attend_refuses_a_lane_bit_its_prepare_does_not_write():
    """The one-call path: the lane bit and the prepare's lane scales go together, either way a sentence."""
    from vc_attention.kernels import backend_sm90
    from vc_attention.kernels import prepare_cuda as prep

    _sm90()
    q, k, v = _qkv(600, torch.bfloat16, seed=1)
    out = torch.empty_like(q)
    forward, error = backend_sm90._entry()
    lanes_args = prep.binding_args(q, k, v, None, FIDELITY_LANES, "bhnd", None, None)
    plain_args = prep.binding_args(q, k, v, None, FIDELITY, "bhnd", None, None)
    with pytest.raises(ValueError, match="does not say so"):
        prep.extension().prepare_attend(*lanes_args, out, False, 1 | VSMOOTH_PAIRED_K, forward, error, False)
    with pytest.raises(ValueError, match="keeps one per block"):
        prep.extension().prepare_attend(*plain_args, out, False, 1 | VSMOOTH_PAIRED_K | VSMOOTH_K_LANES, forward, error, False)
    prep.extension().prepare_attend(*lanes_args, out, False, 1 | VSMOOTH_PAIRED_K | VSMOOTH_K_LANES, forward, error, False)
    assert torch.isfinite(out).all()


def _mma():
    backend = backends.get("mma")
    if backend.availability():
        pytest.skip(f"mma: {backend.availability()}")
    return backend


@pytest.mark.parametrize("n", [1100, 3000, 4097, 2053])  # the last two: lanes without a valid key (see above)
@pytest.mark.parametrize("config", [SPEED_LANES, FIDELITY_LANES], ids=["speed", "fidelity"])
def test_the_portable_lane_kernels_match_their_emulation(n, config):
    """The mma backend (wide layout, 64-key steps) with lane scales runs its lane kernel (the profiler's name carries
    the fifth template flag) and matches the float64 emulation at its 64-key step within the gate."""
    from vc_attention.kernels import api

    backend = _mma()
    q, k, v = _qkv(n, torch.bfloat16, seed=13)
    perm = torch.argsort(torch.rand(1, 2, n, device="cuda"), dim=-1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = api.vc_attention(q, k, v, config=config, perm=perm, backend="mma")
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "attn_mma" in e.name]
    assert names and all(("true>" in nm or "ELb1EEEv" in nm) for nm in names), names
    step = backend.softmax_step(128, config)
    emul = reference.vc_attention_reference(q, k, v, config, perm=perm, parts=True, offset_block=step).out
    assert torch.isfinite(out).all() and _rel_l2(out, emul) <= _rel_l2(emul.to(out.dtype), emul) + GATE
