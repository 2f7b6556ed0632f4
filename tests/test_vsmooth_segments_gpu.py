"""GPU tier of V-Smooth segments (VCConfig.v_mean_merge): the CUDA prepare's segment statistics and merge
against reference.vsmooth_segments, and the Hopper speed loop that restores a mean only at segment ends.

  pytest -q -m gpu tests/test_vsmooth_segments_gpu.py
"""
import pytest
import torch

from vc_attention.kernels import backends, reference
from vc_attention.kernels.config import SPEED
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.kernels.prepare_reference import prepare_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MERGED = SPEED.with_(v_mean_merge=True, k_lane_scales=False)  # the segments alone (with lanes: tests/test_k_lanes_gpu.py)
GATE = 1e-3  # tests/test_backends_gpu.py's: rel-L2 above the dtype's rounding of the float64 emulation


def _clustered_qkv(n: int, d: int, dtype, heads: int = 2, seed: int = 0):
    """Q, K random; V a cluster-sorted sequence (runs of 100-900 rows around separated centres), as the
    grouping leaves it: segments must follow the runs."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(1, heads, n, d, generator=gen, device="cuda") for _ in range(2))
    v = torch.empty(1, heads, n, d, device="cuda")
    for h in range(heads):
        start = 0
        while start < n:
            run = int(torch.randint(100, 900, (1,), generator=gen, device="cuda"))
            centre = 3.0 * torch.randn(d, generator=gen, device="cuda")
            v[0, h, start:start + run] = centre + torch.randn(min(run, n - start), d, generator=gen, device="cuda")
            start += run
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _margins(v_perm: torch.Tensor) -> torch.Tensor:
    """(B,H,nb) relative distance of each block's merge test from its threshold (reference arithmetic),
    recomputed with the reference's own segment anchors: where it is tiny, float32 summation order may
    decide either way."""
    seg = reference.vsmooth_segments(v_perm)
    b, h, n, d = v_perm.shape
    vf = v_perm.float()
    m = reference.block_means(vf, 256)
    mu = m.half().float()
    nb = m.shape[2]
    dev = reference.pad_rows(vf - reference.expand_rows(mu, 256, n), 256).reshape(b, h, nb, 256, d)
    energy = dev.square().sum(dim=(3, 4))
    ends = seg.seg_end.reshape(b, h, -1)
    ends = torch.nn.functional.pad(ends, (0, 2 * nb - ends.shape[-1])).reshape(b, h, nb, 2).amax(-1)
    starts = torch.ones_like(ends, dtype=torch.bool)
    starts[..., 1:] = ends[..., :-1].bool()
    anchor_idx = (torch.arange(nb, device=v_perm.device) * starts).cummax(-1).values
    anchor = m.gather(2, anchor_idx.unsqueeze(-1).expand(b, h, nb, d))
    rows = torch.full((nb,), 256.0, device=v_perm.device)
    rows[-1] = n - 256 * (nb - 1)
    lhs = reference.V_MERGE_INV_KAPPA2 * (m - anchor).square().sum(-1) * rows
    return ((lhs - energy).abs() / energy.clamp(min=1e-30))


@pytest.mark.parametrize("n,d,dtype", [(3000, 128, torch.bfloat16), (2944, 128, torch.float16), (1100, 128, torch.float16)])
def test_cuda_prepare_matches_the_segment_spec(n, d, dtype):
    q, k, v = _clustered_qkv(n, d, dtype, seed=n)
    perm = torch.stack([torch.stack([torch.arange(n, device="cuda")] * 2)])  # the identity: V stays cluster-sorted
    ops = prepare_cuda(q, k, v, perm.int(), MERGED, "bhnd")
    spec = prepare_reference(q, k, v, perm, MERGED, "bhnd")
    close_calls = _margins(v) < 1e-4
    assert ops.v_seg_end is not None and ops.v_seg_end.shape == spec.v_seg_end.shape
    differs = ops.v_seg_end != spec.v_seg_end
    if differs.any():  # only blocks whose test sits on its threshold may go either way
        slots_close = close_calls.repeat_interleave(2, dim=-1)[..., :differs.shape[-1]]
        assert bool(slots_close[differs].all()), "a segment decision away from its threshold differs from the spec"
        pytest.skip("a merge test sat on its threshold: the decisions legitimately differ")
    assert int(ops.v_seg_end.sum()) > 2, "the clustered data must give several segments per head"
    # the float32 block means' summation order differs from torch's: an fp16 mean may round the other way
    same = (ops.v_mean == spec.v_mean).float().mean().item()
    assert same > 0.99, same
    torch.testing.assert_close(ops.v_mean.float(), spec.v_mean.float(), rtol=1e-3, atol=0)
    torch.testing.assert_close(ops.v_scale, spec.v_scale, rtol=1e-3, atol=0)
    codes_equal = (ops.v_t.view(torch.uint8) == spec.v_t.view(torch.uint8)).float().mean().item()
    assert codes_equal > 0.999, codes_equal


def test_head_dim_64_prepares_no_segments():
    q, k, v = _clustered_qkv(2944, 64, torch.float16, seed=1)
    ops = prepare_cuda(q, k, v, None, MERGED, "bhnd")
    spec = prepare_reference(q, k, v, None, MERGED, "bhnd")
    assert ops.v_seg_end is None and spec.v_seg_end is None
    torch.testing.assert_close(ops.v_mean.float(), spec.v_mean.float(), rtol=1e-3, atol=1e-3)


def test_segments_on_data_without_structure_cover_the_head():
    """Random V (one distribution): one segment per head, the restore once at its end."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 4, 4096, 128, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ops = prepare_cuda(q, k, v, None, MERGED, "bhnd")
    assert ops.v_seg_end.sum(-1).tolist() == [[1, 1, 1, 1]] and ops.v_seg_end[..., -1].all()


@pytest.mark.parametrize("n,dtype", [(3000, torch.bfloat16), (1100, torch.float16), (2944, torch.bfloat16)])
def test_sm90_segment_restore_matches_its_emulation_and_reads_the_flags(n, dtype):
    """The speed loop with segment ends matches the float64 emulation; the same operands with the per-step
    restore (no flags) agree to rounding but not bit for bit (the segment fold ran); and flags that lie
    (one segment for the whole head over distinct segment means) give a wrong output, so the kernel reads
    them rather than restoring every step."""
    from vc_attention.kernels import backend_sm90

    backend = backends.get("sm90")
    if backend.availability():
        pytest.skip(f"sm90: {backend.availability()}")
    q, k, v = _clustered_qkv(n, 128, dtype, seed=7)
    perm = torch.stack([torch.stack([torch.arange(n, device="cuda")] * 2)]).int()
    ops = prepare_cuda(q, k, v, perm, MERGED, "bhnd")
    assert int(ops.v_seg_end.sum()) >= 4
    out = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")
    backend.attend(ops, MERGED, out, "bhnd")
    step = backend.softmax_step(128, MERGED)
    emul = reference.vc_attention_reference(q, k, v, MERGED, perm=perm, parts=True, offset_block=step).out
    floor = _rel_l2(emul.to(dtype), emul)
    assert torch.isfinite(out).all() and _rel_l2(out, emul) <= floor + GATE

    def run(seg_end):
        o = torch.empty_like(q)
        backend_sm90.extension().attention(ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean,
                                           None, None, None, o, ops.n_tokens, True, 2,
                                           torch.cuda.current_stream().cuda_stream, seg_end)
        return o

    per_step = run(None)
    assert not torch.equal(per_step, out) and _rel_l2(per_step, emul) <= floor + GATE
    lying = torch.zeros_like(ops.v_seg_end)
    lying[..., -1] = 1
    assert _rel_l2(run(lying), emul) > 10 * GATE


def test_the_public_call_runs_segments_on_the_step_mean_kernel(sm90_kernel_flags):
    """vc_attention with the merged config on sm90: the STEPMEAN kernel runs (profiler name) and matches
    the emulation; the node's grouping perm (kernels.grouping) makes the segments."""
    from vc_attention.kernels import api, grouping

    backend = backends.get("sm90")
    if backend.availability():
        pytest.skip(f"sm90: {backend.availability()}")
    from vc_attention.study.videodata import video_like_qkv

    q, k, v = video_like_qkv(B=1, H=2, T=4, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, device="cuda")
    perm = grouping.group_tokens(v, 64, 2).perm()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = api.vc_attention(q, k, v, config=MERGED, perm=perm, backend="sm90", perm_from_grouping=True)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "vc_attention_sm90_kernel" in e.name]
    assert names and all(sm90_kernel_flags(nm)[:2] == (False, True) for nm in names), names
    assert any("segments_kernel" in e.name for e in prof.events())
    step = backend.softmax_step(128, MERGED)
    emul = reference.vc_attention_reference(q, k, v, MERGED, perm=perm, parts=True, offset_block=step).out
    floor = _rel_l2(emul.to(out.dtype), emul)
    assert _rel_l2(out, emul) <= floor + GATE


def _mma_or_skip():
    backend = backends.get("mma")
    if backend.availability():
        pytest.skip(f"mma: {backend.availability()}")
    return backend


@pytest.mark.parametrize("n,dtype", [(3000, torch.bfloat16), (1100, torch.float16)])
def test_mma_segment_restore_matches_its_emulation_and_reads_the_flags(n, dtype):
    """The portable kernel restores the V-Smooth mean only on a segment's last tile (csrc/attn_mma_wide.cuh):
    it matches the float64 emulation; without flags (the restore on every tile) it agrees to rounding but not
    bit for bit (the segment path ran); and flags that lie (one segment over distinct segment means) give a
    wrong output, so the kernel reads them."""
    import dataclasses

    from vc_attention.kernels import backend_mma

    backend = _mma_or_skip()
    q, k, v = _clustered_qkv(n, 128, dtype, seed=11)
    perm = torch.stack([torch.stack([torch.arange(n, device="cuda")] * 2)]).int()
    ops = prepare_cuda(q, k, v, perm, MERGED, "bhnd")
    assert int(ops.v_seg_end.sum()) >= 4

    def run(seg_end):
        out = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")
        return backend_mma.attention_from_operands(dataclasses.replace(ops, v_seg_end=seg_end), MERGED, out, "bhnd")

    segments = run(ops.v_seg_end)
    step = backend.softmax_step(128, MERGED)
    emul = reference.vc_attention_reference(q, k, v, MERGED, perm=perm, parts=True, offset_block=step).out
    floor = _rel_l2(emul.to(dtype), emul)
    assert torch.isfinite(segments).all() and _rel_l2(segments, emul) <= floor + GATE
    per_tile = run(torch.ones_like(ops.v_seg_end))  # a segment end on every tile: the restore on every tile
    assert not torch.equal(per_tile, segments) and _rel_l2(per_tile, emul) <= floor + GATE
    lying = torch.zeros_like(ops.v_seg_end)
    lying[..., -1] = 1
    assert _rel_l2(run(lying), emul) > 10 * GATE
    # the public call passes the operands' flags: the same output as the direct run above
    attended = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")
    backend.attend(ops, MERGED, attended, "bhnd")
    assert torch.equal(attended, segments)


def test_mma_binding_refuses_flags_it_cannot_use():
    """v_seg_end only with V-Smooth operands, uint8, (B, H, n_pad / 128): a clear ValueError, no launch."""
    from vc_attention.kernels import backend_mma, mma_v_f16

    _mma_or_skip()
    q, k, v = _clustered_qkv(1100, 128, torch.float16, seed=2)
    perm = torch.stack([torch.stack([torch.arange(1100, device="cuda")] * 2)]).int()
    ops = prepare_cuda(q, k, v, perm, MERGED, "bhnd")
    mean = backend_mma.mean_operand(ops) if backend_mma.extension().mean_scaled() else ops.v_mean
    out = torch.empty_like(q)

    def call(seg_end, vsmooth=True):
        # V in the form the default build's kernel for these flags reads (f16 codes in the via-f16 default's
        # head-dim-128 V-Smooth kernels), so only the seg_end check can refuse
        flags = backend_mma.default_flags()
        f16 = mma_v_f16.takes_v_f16(flags, ops.v_t.shape[2], False, vsmooth)
        v_t = backend_mma.v_f16_operand(ops.v_t, flags) if f16 else ops.v_t
        backend_mma.extension().attention(ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, v_t, ops.v_scale, mean, out, None,
                                          ops.n_tokens, False, True, vsmooth, torch.cuda.current_stream().cuda_stream, seg_end)

    call(ops.v_seg_end)  # the operands' own flags are accepted
    with pytest.raises(ValueError, match="V-Smooth"):
        call(ops.v_seg_end, vsmooth=False)
    with pytest.raises(ValueError, match="uint8"):
        call(ops.v_seg_end.int())
    with pytest.raises(ValueError, match="n_pad / 128"):
        call(ops.v_seg_end[..., :-1].contiguous())


@pytest.mark.parametrize("n,dtype", [(3000, torch.bfloat16), (1100, torch.float16)])
def test_mma_restores_paired_means_once_per_pair_at_head_dim_64(n, dtype, monkeypatch):
    """Speed mode at head dim 64 has V-Smooth means equal in 128-row pairs and no segments: the portable kernel
    gets end flags on every second tile (backend_mma.pair_restore_flags), so it restores each pair's mean once.
    The public call passes them (the fast path ran), the output matches the float64 emulation, and it agrees with
    the restore on every tile to rounding but not bit for bit (the flags were read)."""
    import dataclasses

    from vc_attention.kernels import backend_mma

    backend = _mma_or_skip()
    if backend_mma.MEAN_SCALED_FLAG not in backend_mma.default_flags():
        pytest.skip("this GPU's build restores on every tile (it reads no flags)")
    q, k, v = _clustered_qkv(n, 64, dtype, seed=5)
    perm = torch.stack([torch.stack([torch.arange(n, device="cuda")] * 2)]).int()
    ops = prepare_cuda(q, k, v, perm, SPEED, "bhnd")
    assert ops.v_seg_end is None and SPEED.v_mean_rows == 256
    seen = []
    ext = backend_mma.extension()

    class Spy:
        def __getattr__(self, name):
            return getattr(ext, name)

        def attention(self, *args):
            seen.append(args[-1])
            return ext.attention(*args)

    monkeypatch.setattr(backend_mma, "extension", lambda *a, **kw: Spy())
    paired = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")
    backend.attend(ops, SPEED, paired, "bhnd")
    slots = ops.v_mean.shape[2]
    want = torch.zeros(1, 2, slots, dtype=torch.uint8, device="cuda")
    want[..., 1::2] = 1
    want[..., -1] = 1
    assert len(seen) == 1 and seen[0] is not None and torch.equal(seen[0], want)
    step = backend.softmax_step(64, SPEED)
    emul = reference.vc_attention_reference(q, k, v, SPEED, perm=perm, parts=True, offset_block=step).out
    floor = _rel_l2(emul.to(dtype), emul)
    assert torch.isfinite(paired).all() and _rel_l2(paired, emul) <= floor + GATE
    every_tile = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")
    backend_mma.attention_from_operands(dataclasses.replace(ops, v_seg_end=torch.ones_like(want)), SPEED, every_tile, "bhnd")
    assert not torch.equal(every_tile, paired) and _rel_l2(every_tile, paired) < 1e-4


def test_mma_pair_flags_replay_from_a_cuda_graph():
    """The pair flags are made outside any capture (a warm-up call) and replay from a CUDA graph bit for bit; a capture
    that meets a shape without them restores on every tile (a tensor made inside a capture would hold its values only
    after replay) and agrees to rounding."""
    from vc_attention.kernels import backend_mma

    backend = _mma_or_skip()
    if backend_mma.MEAN_SCALED_FLAG not in backend_mma.default_flags():
        pytest.skip("this GPU's build reads no flags")
    n = 2000
    q, k, v = _clustered_qkv(n, 64, torch.bfloat16, seed=7)
    perm = torch.stack([torch.stack([torch.arange(n, device="cuda")] * 2)]).int()
    ops = prepare_cuda(q, k, v, perm, SPEED, "bhnd")

    def capture():
        out = torch.empty_like(q)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            backend.attend(ops, SPEED, out, "bhnd")
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        return out

    eager = torch.empty_like(q)
    backend.attend(ops, SPEED, eager, "bhnd")  # the warm-up makes this shape's flags
    assert torch.equal(capture(), eager)
    backend_mma._PAIR_FLAGS.clear()
    unflagged = capture()
    assert not backend_mma._PAIR_FLAGS  # nothing was made inside the capture
    assert not torch.equal(unflagged, eager) and _rel_l2(unflagged, eager) < 1e-4
