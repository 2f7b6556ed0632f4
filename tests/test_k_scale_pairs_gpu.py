"""GPU tier of K scales per 256 keys (VCConfig.k_scale_rows, config.SPEED and config.FIDELITY): the CUDA prepare's
paired scales against the spec, and the Hopper speed and fidelity loops that read one K scale and take one row
maximum per 256-key step (VC_SM90_KPAIR, VC_SM90_KPAIR_EXP2).

  pytest -q -m gpu tests/test_k_scale_pairs_gpu.py
"""
import pytest
import torch

from vc_attention.kernels import backends, reference
from vc_attention.kernels.config import FIDELITY as FIDELITY_PRESET, PLAIN_8BIT, SPEED as SPEED_PRESET
from vc_attention.kernels.constants import VSMOOTH_PAIRED_K
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.kernels.prepare_reference import prepare_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# the paired-K loop as it runs without the refinements (tests/test_sm90_refined_gpu.py has the refined kernels)
FIDELITY = FIDELITY_PRESET.without_refinements()

GATE = 1e-3  # tests/test_backends_gpu.py's: rel-L2 above the dtype's rounding of the float64 emulation
# the speed loop's K pairing alone (config.SPEED adds K scales per lane: tests/test_k_lanes_gpu.py runs those)
SPEED = SPEED_PRESET.with_(k_lane_scales=False)
PER_TILE = SPEED.with_(k_scale_rows=128)
FIDELITY_PER_TILE = FIDELITY.with_(k_scale_rows=128)  # a custom configuration: the exp2 loop that reads each tile's


def _qkv(n: int, d: int, dtype, seed: int = 0):
    """Random Q, K, V with a loud stretch of K (rows 300-419 x 4), so that the two 128-key blocks of a pair
    have different amaxes and the paired scale differs from the per-tile one."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, d, generator=gen, device="cuda") for _ in range(3))
    k[..., 300:420, :] *= 4.0
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("n", [1000, 1100, 4097])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
@pytest.mark.parametrize("smooth_k", [True, False])
@pytest.mark.parametrize("base", [SPEED, FIDELITY], ids=["speed", "fidelity"])
def test_cuda_prepare_writes_the_paired_k_scales_of_the_spec(n, d, dtype, smooth_k, base):
    """k_scale and k_q of the CUDA prepare are prepare_reference's at k_scale_rows 256 (pairs equal bit for
    bit, a lone last slot its own), with a permutation, with and without K smoothing, with 256-row means
    (speed) and 128-row ones (fidelity: the statistics blocks are half a pair, k_pair_amax combines two); as
    in the contract test (tests/test_backends_gpu.py) the K mean is a float32 sum in another order: scales
    within 1e-6, rare one-code differences."""
    config = base.with_(smooth_k=smooth_k)
    q, k, v = _qkv(n, d, dtype, seed=n + d)
    perm = torch.argsort(torch.rand(1, 2, n, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, config, "bhnd")
    want = prepare_reference(q, k, v, perm, config, "bhnd")
    slots = got.k_scale.shape[-1]
    torch.testing.assert_close(got.k_scale, want.k_scale.to(got.k_scale.device), rtol=1e-6, atol=0)
    off = (got.k_q.float() - want.k_q.to(got.k_q.device).float()).abs()
    assert off.max() <= 1 and (off > 0).float().mean() < 1e-3
    per_tile = prepare_cuda(q, k, v, perm, config.with_(k_scale_rows=128), "bhnd")
    if d == 128:
        assert torch.equal(got.k_scale[..., 0:slots - 1:2], got.k_scale[..., 1:slots:2])
        assert not torch.equal(per_tile.k_scale, got.k_scale)
    else:  # head dim 64: one K scale per 128 keys (reference.k_scale_rows), so the statistics pass skips the K extremes
        assert torch.equal(per_tile.k_scale, got.k_scale) and torch.equal(per_tile.k_q, got.k_q)


def _sm90():
    backend = backends.get("sm90")
    if backend.availability():
        pytest.skip(f"sm90: {backend.availability()}")
    return backend


def _attend_within_the_gate(config, n: int, dtype, seed: int, permute: bool):
    """The CUDA prepare and the sm90 backend's attend on `_qkv` data (a random permutation or the identity), checked
    against the float64 emulation at the kernel's 256-key step: (ops, out, emulation, the dtype's floor)."""
    backend = _sm90()
    q, k, v = _qkv(n, 128, dtype, seed=seed)
    perm = (torch.argsort(torch.rand(1, 2, n, device="cuda"), dim=-1) if permute
            else torch.arange(n, device="cuda").expand(1, 2, n).contiguous().int())
    ops = prepare_cuda(q, k, v, perm, config, "bhnd")
    out = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")
    backend.attend(ops, config, out, "bhnd")
    step = backend.softmax_step(128, config)
    assert step == 256
    emul = reference.vc_attention_reference(q, k, v, config, perm=perm, parts=True, offset_block=step).out
    floor = _rel_l2(emul.to(dtype), emul)
    assert torch.isfinite(out).all() and _rel_l2(out, emul) <= floor + GATE
    return ops, out, emul, floor


def _binding_run(ops, like: torch.Tensor, k_scale, expcast: bool, mode: int, seg_end=None):
    """The sm90 attention binding on `ops` with these K scales and this vsmooth mode, into a poisoned output shaped
    and typed like `like`."""
    from vc_attention.kernels import backend_sm90

    o = torch.full_like(like, float("nan"))
    backend_sm90.extension().attention(ops.q_q, ops.q_scale, ops.k_q, k_scale, ops.v_t, ops.v_scale, ops.v_mean,
                                       None, None, None, o, ops.n_tokens, expcast, mode,
                                       torch.cuda.current_stream().cuda_stream, seg_end)
    return o


@pytest.mark.parametrize("n,dtype", [(3000, torch.bfloat16), (1100, torch.float16)])
def test_paired_speed_loop_matches_its_emulation_and_reads_one_scale_per_step(n, dtype):
    """The speed loop at k_scale_rows 256 matches the float64 emulation (one anchor per step). It reads only
    the first tile's K scale of a step: scaling the second tiles' scales leaves its output unchanged bit for
    bit, while the per-tile loop (vsmooth mode 1, the same operands) changes, so the paired loop is what ran.
    (The per-tile loop anchors each tile at its own maximum: on these operands that is another encoding,
    ~2e-3 rel-L2 away from the paired spec, bench/sm90_check.py's gate fails it, so it is not compared.)"""
    ops, out, _, _ = _attend_within_the_gate(SPEED, n, dtype, seed=5, permute=False)

    def run(k_scale, mode):
        return _binding_run(ops, out, k_scale, True, mode, ops.v_seg_end if mode == 2 else None)

    odd_scaled = ops.k_scale.clone()
    odd_scaled[..., 1::2] *= 1.5
    assert torch.equal(run(ops.k_scale, 2), out)
    assert torch.equal(run(odd_scaled, 2), out)
    per_tile = run(ops.k_scale, 1)
    assert torch.isfinite(per_tile).all() and not torch.equal(per_tile, out)
    assert not torch.equal(run(odd_scaled, 1), per_tile)


@pytest.mark.parametrize("n", [3000, 1100])  # an even and an odd number of 128-key tiles (the tail runs alone)
def test_paired_fidelity_loop_matches_its_emulation_and_reads_one_scale_per_step(n):
    """Fidelity's exp2 256-key loop told that the K scales are paired (vsmooth 1 + VSMOOTH_PAIRED_K, what FIDELITY
    sends) matches the float64 emulation and reads only the first tile's K scale of a step: scaling the second
    tiles' scales leaves its output unchanged bit for bit, while the same call without the bit (the per-tile loop)
    changes with them. On paired operands both loops compute the same function (exp2 P has no anchor).
    (bf16 out: with fp16 out this loud-K data puts either exp2 loop 1.2-1.5e-3 above the emulation's floor, the
    per-tile loop on per-tile operands as much: measured on the H200, docs/kernel-notes.md section 30.)"""
    from vc_attention.kernels import backend_sm90

    assert backend_sm90.vsmooth_mode(FIDELITY) == 1 | VSMOOTH_PAIRED_K and backend_sm90.vsmooth_mode(FIDELITY_PER_TILE) == 1
    ops, out, emul, floor = _attend_within_the_gate(FIDELITY, n, torch.bfloat16, seed=15, permute=True)

    def run(k_scale, mode):
        return _binding_run(ops, out, k_scale, False, mode)

    odd_scaled = ops.k_scale.clone()
    odd_scaled[..., 1::2] *= 1.5
    paired = 1 | VSMOOTH_PAIRED_K
    assert torch.equal(run(ops.k_scale, paired), out)
    assert torch.equal(run(odd_scaled, paired), out)
    per_tile = run(ops.k_scale, 1)
    assert torch.isfinite(per_tile).all() and _rel_l2(per_tile, emul) <= floor + GATE
    assert not torch.equal(run(odd_scaled, 1), per_tile)


# (config, the kernel's (LOWRANK, STEPMEAN, KPAIR, KLANES) flags): paired K scales run the loops that read one per step
PUBLIC_CALLS = {
    "speed": (SPEED, (False, True, False, False)),  # the STEPMEAN kernel (its K pairing is VC_SM90_KPAIR's)
    "speed-128-key-scales": (PER_TILE, (False, False, False, False)),
    "fidelity": (FIDELITY, (False, False, True, False)),  # the KPAIR kernel
    "fidelity-128-key-scales": (FIDELITY_PER_TILE, (False, False, False, False)),
}


@pytest.mark.parametrize("name", list(PUBLIC_CALLS))
def test_the_public_call_runs_the_loop_its_k_scales_ask_for(name, sm90_kernel_flags):
    """vc_attention on sm90 runs the paired loop (profiler name: the template flags) exactly where the configuration
    pairs the K scales, within the emulation's gate either way: a caller who keeps per-tile scales never gets a kernel
    that reads one scale for two tiles."""
    from vc_attention.kernels import api, backend_sm90

    _sm90()
    config, flags = PUBLIC_CALLS[name]
    paired = reference.k_scale_rows(config, 128) == 256
    assert bool(backend_sm90.vsmooth_mode(config) & VSMOOTH_PAIRED_K) == paired
    q, k, v = _qkv(2000, 128, torch.bfloat16, seed=9)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = api.vc_attention(q, k, v, config=config, backend="sm90")
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "vc_attention_sm90_kernel" in e.name]
    assert names and all(sm90_kernel_flags(nm) == flags for nm in names), names
    emul = reference.vc_attention_reference(q, k, v, config, parts=True, offset_block=256).out
    assert _rel_l2(out, emul) <= _rel_l2(emul.to(out.dtype), emul) + GATE


def test_prepare_attend_refuses_a_paired_k_bit_its_prepare_does_not_pair():
    """prepare_attend refuses the paired-K bit unless its own prepare pairs the K scales (k_scale_rows 256): the
    kernel that would read one scale per step never runs on per-tile scales."""
    from vc_attention.kernels import backend_sm90, prepare_cuda as prep

    _sm90()
    q, k, v = _qkv(500, 128, torch.bfloat16, seed=23)
    out = torch.empty_like(q)
    args = prep.binding_args(q, k, v, None, FIDELITY_PER_TILE, "bhnd", None, None)
    forward, error = backend_sm90._entry()
    with pytest.raises(ValueError, match="K scales are paired"):
        prep.extension().prepare_attend(*args, out, False, 1 | VSMOOTH_PAIRED_K, forward, error, False)
    args = prep.binding_args(q, k, v, None, FIDELITY, "bhnd", None, None)
    prep.extension().prepare_attend(*args, out, False, 1 | VSMOOTH_PAIRED_K, forward, error, False)
    emul = reference.vc_attention_reference(q, k, v, FIDELITY, parts=True, offset_block=256).out
    assert _rel_l2(out, emul) <= _rel_l2(emul.to(out.dtype), emul) + GATE


def test_the_attention_binding_refuses_a_paired_k_bit_without_v_smooth():
    """The paired-K bit belongs to V-Smooth: per-channel V plus the bit is refused with a sentence."""
    from vc_attention.kernels import backend_sm90

    _sm90()
    q, k, v = _qkv(500, 128, torch.bfloat16, seed=23)
    ops = prepare_cuda(q, k, v, None, PLAIN_8BIT, "bhnd")
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="vsmooth must be 0"):
        backend_sm90.extension().attention(ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean,
                                           None, None, None, out, ops.n_tokens, False, VSMOOTH_PAIRED_K,
                                           torch.cuda.current_stream().cuda_stream, None)
