"""The V knobs of bench/fidelity_study.py against the spec's quantizer.

The mean-block knob at 128 rows must reproduce reference.quantize_v_vsmooth bit for bit (so the knob's
rows differ from the spec's only by the block size), and a smaller block must remove more of V's slow
variation. The head-global low-rank knob must take the residual's dominant directions out before the
FP8 rounding: on V whose residual is mostly rank 2, rank 3 leaves a much smaller error than the spec.
"""
import torch

from vc_attention.bench import fidelity_study
from vc_attention.bench.fidelity_study import cluster_segments, v_hat_cluster_means, v_hat_lowrank, v_hat_mean_rows
from vc_attention.kernels import reference as ref


def _smooth_v(n=1000, d=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    drift = torch.cumsum(torch.randn(1, 2, n, d, generator=gen), dim=2) * 0.1  # slowly varying tokens
    return (drift + 0.05 * torch.randn(1, 2, n, d, generator=gen)).bfloat16()


def test_128_rows_is_the_spec():
    v = _smooth_v()
    assert torch.equal(v_hat_mean_rows(v, ref.V_BLOCK), ref.quantize_v_vsmooth(v).dequantized().float())


def test_smaller_blocks_quantize_a_smaller_residual():
    v = _smooth_v()
    err = {rows: float((v_hat_mean_rows(v, rows) - v.float()).norm()) for rows in (128, 64, 32)}
    assert err[32] < err[64] < err[128]


def test_low_rank_term_takes_the_residuals_main_directions_out():
    gen = torch.Generator().manual_seed(1)
    n, d = 2048, 64
    directions = torch.linalg.qr(torch.randn(d, 2, generator=gen)).Q.T  # two orthonormal directions
    coeffs = torch.randn(1, 2, n, 2, generator=gen) * torch.tensor([3.0, 1.5])
    v = (coeffs @ directions + 0.05 * torch.randn(1, 2, n, d, generator=gen) + 2.0).bfloat16()
    spec = float((ref.quantize_v_vsmooth(v).dequantized().float() - v.float()).norm())
    low = float((v_hat_lowrank(v, 3) - v.float()).norm())
    sampled = float((v_hat_lowrank(v, 3, sample=512) - v.float()).norm())
    assert low < 0.3 * spec and sampled < 0.3 * spec


def test_cluster_means_equal_block_means_when_the_clusters_are_the_blocks():
    """Labels that change every 128 rows make one segment per block: the spec's V, bit for bit; labels
    of two well-separated groups take each group's own mean out (a smaller residual than the blocks',
    which straddle the groups)."""
    v = _smooth_v(n=1024)
    blocks = (torch.arange(1024) // ref.V_BLOCK).expand(1, 2, 1024)
    assert torch.equal(v_hat_cluster_means(v, blocks), ref.quantize_v_vsmooth(v).dequantized().float())
    gen = torch.Generator().manual_seed(2)
    sizes = (300, 724)
    two = torch.cat([torch.randn(1, 2, s, 64, generator=gen) * 0.1 + c for s, c in zip(sizes, (-4.0, 4.0))], dim=2).bfloat16()
    labels = torch.cat([torch.full((1, 2, s), i) for i, s in enumerate(sizes)], dim=2)
    err_cluster = float((v_hat_cluster_means(two, labels) - two.float()).norm())
    err_blocks = float((ref.quantize_v_vsmooth(two).dequantized().float() - two.float()).norm())
    assert err_cluster < err_blocks


def test_merged_segments_are_long_enough_and_break_only_where_the_label_changes():
    labels = torch.tensor([0] * 100 + [1] * 300 + [2] * 50 + [3] * 400 + [4] * 30).view(1, 1, -1)
    seg = cluster_segments(labels, 256)[0, 0]
    # label changes at 100, 400, 450 and 850: 100 is too early, 450 too close to 400, 850 leaves a 30-row tail
    assert torch.bincount(seg).tolist() == [400, 480]
    assert torch.equal(cluster_segments(labels)[0, 0], torch.repeat_interleave(torch.arange(5), torch.tensor([100, 300, 50, 400, 30])))


def test_the_rms3_knob_is_the_segment_spec():
    """The study's rms3 knob (tight bound) takes the segments and means of reference.vsmooth_segments, the
    spec the kernels follow (VCConfig.v_mean_merge); its loose-bound twin differs only in the scale."""
    from vc_attention.kernels import reference as ref

    g = torch.Generator().manual_seed(0)
    v = torch.cat([3 * torch.randn(64, generator=g) + torch.randn(r, 64, generator=g) for r in (300, 700, 500)])
    v = v.view(1, 1, -1, 64).bfloat16()
    spec = ref.vsmooth_segments(v)
    seg, seg_mu, bound = fidelity_study.merged_block_segments(v, fidelity_study.MERGE_KAPPA["rms3"], rms=True)
    assert torch.equal(seg_mu.repeat_interleave(2, dim=2)[:, :, :spec.mean.shape[2]], spec.mean.float())
    torch.testing.assert_close(bound, spec.amax)
    _, _, loose = fidelity_study.merged_block_segments(v, 1 / 3, rms=True, loose=True)
    assert bool((loose >= bound).all()) and not torch.equal(loose, bound)
