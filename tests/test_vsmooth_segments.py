"""The spec of V-Smooth segments (reference.vsmooth_segments, VCConfig.v_mean_merge): which 256-row blocks
merge, the segment means, the end flags the Hopper speed loop reads, and the residual's amax bound."""
import pytest
import torch

from vc_attention.kernels import SPEED, VCConfig
from vc_attention.kernels import reference as ref
from vc_attention.kernels.prepare_reference import prepare_reference


def _clustered(n: int, runs: list[int], d: int = 64, spread: float = 0.3, seed: int = 0) -> torch.Tensor:
    """(1,1,n,d) V made of runs of rows around well separated centres (a cluster-sorted V)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, r in enumerate(runs):
        centre = 4.0 * torch.randn(d, generator=g)
        rows.append(centre + spread * torch.randn(r, d, generator=g))
    v = torch.cat(rows)[:n]
    return v.view(1, 1, n, d)


def test_blocks_of_one_distribution_form_one_segment():
    g = torch.Generator().manual_seed(1)
    v = (torch.randn(1, 2, 2048, 64, generator=g) + 3.0 * torch.randn(64, generator=g)).half()
    seg = ref.vsmooth_segments(v)
    assert seg.seg_end.shape == (1, 2, 16)
    assert seg.seg_end.sum(-1).tolist() == [[1, 1]]
    assert seg.seg_end[..., -1].tolist() == [[1, 1]]
    # every slot holds the head's one mean: the fp16 of its row mean
    assert torch.equal(seg.mean, seg.mean[:, :, :1].expand_as(seg.mean))
    torch.testing.assert_close(seg.mean[:, :, 0].float(), v.float().mean(2), atol=1e-3, rtol=1e-3)  # fp16 rounding


def test_segments_end_where_the_clusters_change():
    v = _clustered(2048, [512, 768, 256, 512]).half()
    seg = ref.vsmooth_segments(v)
    ends = seg.seg_end[0, 0].nonzero().flatten().tolist()
    assert ends == [3, 9, 11, 15]  # last 128-row slot of each run (runs end at rows 512, 1280, 1536, 2048)
    for first, last in zip([0, 4, 10, 12], ends):
        run = v[0, 0, 128 * first:128 * (last + 1)].float()
        assert torch.equal(seg.mean[0, 0, first:last + 1], seg.mean[0, 0, first:first + 1].expand(last + 1 - first, -1))
        torch.testing.assert_close(seg.mean[0, 0, first].float(), run.mean(0), atol=1e-3, rtol=1e-3)  # fp16 rounding


def test_a_block_straddling_two_clusters_ends_a_segment_of_its_own_or_joins_by_the_rule():
    # runs of 384 rows: block 1 (rows 256-511) is half one cluster, half the next; it cannot join either
    v = _clustered(1024, [384, 640]).half()
    seg = ref.vsmooth_segments(v)
    assert seg.seg_end[0, 0].nonzero().flatten().tolist() == [1, 3, 7]


def test_the_merge_threshold_is_one_ninth_of_the_residual_energy():
    """Block 1 is block 0 shifted by s along one channel: it joins iff 9 s^2 rows <= its residual energy."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(256, 64, generator=g)
    base = base - base.mean(0)  # the block means are exactly the shifts below
    energy = base.square().sum().item()
    limit = (energy / (9.0 * 256)) ** 0.5
    for factor, joins in ((0.9, True), (1.1, False)):
        shift = torch.zeros(64)
        shift[5] = factor * limit
        v = torch.cat([base, base + shift]).view(1, 1, 512, 64)
        seg = ref.vsmooth_segments(v)
        assert seg.seg_end[0, 0].tolist() == ([0, 0, 0, 1] if joins else [0, 1, 0, 1]), factor


def test_a_lone_last_slot_ends_the_head():
    v = _clustered(300, [300]).half()  # three 128-row slots: the last 256-row block has one
    seg = ref.vsmooth_segments(v)
    assert seg.seg_end.shape == (1, 1, 3)
    assert seg.seg_end[0, 0].tolist() == [0, 0, 1]


def test_the_residual_amax_bound_covers_every_residual():
    v = _clustered(3000, [700, 900, 1400], d=128, spread=1.0).bfloat16()
    seg = ref.vsmooth_segments(v)
    resid = v.float() - ref.expand_rows(seg.mean.float(), ref.V_BLOCK, v.shape[-2])
    exact = resid.abs().amax(-2, keepdim=True)
    assert bool((exact <= seg.amax).all())
    assert bool((seg.amax <= 1.5 * exact).all())  # a bound, not a blow-up (shifts are small where blocks merge)


def test_merged_config_needs_256_row_vsmooth_means():
    assert "-merged" in SPEED.with_(v_mean_merge=True).tag and "-merged" not in SPEED.with_(v_mean_merge=False).tag
    for bad in (dict(v_mean_rows=128), dict(v="per_channel", v_mean_rows=128), dict(v_rank=2)):
        with pytest.raises(ValueError, match="v_mean_merge"):
            SPEED.with_(v_mean_merge=True, **bad)
    with pytest.raises(ValueError, match="True or False"):
        VCConfig(v_mean_merge=1)


def test_prepare_reference_carries_the_segment_ends_and_means():
    v = _clustered(1000, [500, 500], d=128).half()
    q = torch.randn_like(v)
    assert SPEED.v_mean_merge
    ops = prepare_reference(q, q, v, None, SPEED)
    seg = ref.vsmooth_segments(v)
    assert torch.equal(ops.v_seg_end, seg.seg_end)
    assert torch.equal(ops.v_mean, seg.mean)
    torch.testing.assert_close(ops.v_scale, (seg.amax / ref.E4M3_MAX).squeeze(-2))
    assert prepare_reference(q, q, v, None, SPEED.with_(v_mean_merge=False)).v_seg_end is None


def test_head_dim_64_keeps_256_row_means():
    """Segments pay only in the Hopper 256-key loop (head dim 128): at 64 the merged config is speed mode's
    256-row means, in the spec and so in every prepare."""
    v = _clustered(1000, [500, 500], d=64).half()
    q = torch.randn_like(v)
    assert not ref.merges(SPEED, 64) and ref.merges(SPEED, 128)
    ops = prepare_reference(q, q, v, None, SPEED)
    assert ops.v_seg_end is None
    assert torch.equal(ops.v_mean, ref.vsmooth_means(v, 256))


def test_merged_means_keep_the_output_close_on_clustered_data():
    """The emulated attention with segment means against exact attention, beside 256-row means per step."""
    v = _clustered(2048, [256, 640, 384, 768], d=128, spread=1.0, seed=4)
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 1, 2048, 128, generator=g) for _ in range(2))
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 128 ** 0.5, -1) @ v.double()
    errs = {}
    for name, cfg in (("speed", SPEED.with_(v_mean_merge=False)), ("merged", SPEED)):
        out = ref.vc_attention_reference(q, k, v, cfg).double()
        errs[name] = ((out - exact).norm() / exact.norm()).item()
    assert errs["merged"] < 1.25 * errs["speed"], errs
