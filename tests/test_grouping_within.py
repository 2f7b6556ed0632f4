"""The within-cluster order's spec (kernels/grouping_within.py) and its use by grouping.group_tokens /
CompactGrouping.perm on the CPU. The fused kernel against this spec: tests/test_grouping_within_gpu.py."""
import pytest
import torch

from vc_attention.kernels import grouping, grouping_within


def line_centroids(d=4):
    """Three clusters on the x axis at 0, 10, 20 (chain ids 0, 1, 2) and an empty fourth."""
    c = torch.zeros(1, 1, 4, d, dtype=torch.float16)
    c[0, 0, :3, 0] = torch.tensor([0.0, 10.0, 20.0])
    c[0, 0, 3, 0] = 99.0  # an empty cluster's stale centroid: nobody's neighbour
    return c


def test_chain_directions_one_sided_at_the_ends_and_before_empty_clusters():
    c = line_centroids()
    counts = torch.tensor([[[5, 3, 2, 0]]], dtype=torch.int32)
    d = grouping_within.chain_directions(c, counts)[0, 0, :, 0]
    # 0: c1 - c0 (no previous), 1: c2 - c0, 2: c2 - c1 (the next one is empty), 3: c3 - c2 (no next)
    assert d.tolist() == [10.0, 20.0, 10.0, 79.0]
    lone = grouping_within.chain_directions(c, torch.tensor([[[0, 4, 0, 0]]], dtype=torch.int32))
    assert lone[0, 0, 1].abs().sum() == 0  # a lone cluster: no direction, every token in bin 0


def test_token_bins_follow_the_projection_on_the_chain_direction():
    c = line_centroids()
    counts = torch.tensor([[[1, 10, 1, 0]]], dtype=torch.int32)
    # cluster 1's tokens at x = 9, 0, 5, 1, 8, 2, 7, 3, 6, 4 (direction +x, scaled by 20)
    xs = torch.tensor([9.0, 0, 5, 1, 8, 2, 7, 3, 6, 4])
    v = torch.zeros(1, 1, 12, 4)
    v[0, 0, 1:11, 0] = xs
    labels = torch.tensor([[[0] + [1] * 10 + [2]]])
    bins = grouping_within.token_bins(v, labels, counts, c, 5)[0, 0, 1:11]
    assert bins.tolist() == [min(4, int(x * 5 / 9)) for x in xs.tolist()]
    perm = grouping_within.within_perm(v, labels, counts, c, 5)[0, 0]
    # by bin, token order inside a bin: x 0,1 | 2,3 | 5,4 (tokens 3, 10) | 7,6 | 9,8
    assert perm.tolist() == [0, 2, 4, 6, 8, 3, 10, 7, 9, 1, 5, 11]


def test_nan_keys_land_in_bin_zero_and_do_not_set_the_range():
    c = line_centroids()
    counts = torch.tensor([[[0, 4, 1, 0]]], dtype=torch.int32)
    v = torch.zeros(1, 1, 5, 4)
    v[0, 0, :4, 0] = torch.tensor([1.0, float("nan"), 3.0, 2.0])
    labels = torch.tensor([[[1, 1, 1, 1, 2]]])
    assert grouping_within.token_bins(v, labels, counts, c, 2)[0, 0, :4].tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("bins", [-1, 33, 2.0, True])
def test_bins_out_of_range_are_refused(bins):
    with pytest.raises(ValueError, match="within-cluster bins"):
        grouping_within.check_bins(bins)


def clustered(n=600, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mu = 4.0 * torch.randn(2, 3, 6, d, generator=gen)
    pick = torch.randint(0, 6, (2, 3, n), generator=gen)
    return torch.gather(mu, 2, pick.unsqueeze(-1).expand(-1, -1, -1, d)) + torch.randn(2, 3, n, d, generator=gen)


def test_group_tokens_within_bins_is_the_spec_and_sorted_by_label_then_bin():
    v = clustered()
    g = grouping.group_tokens(v, 8, 2, within_bins=8)
    perm = g.perm()
    spec = grouping_within.within_perm(v, g.labels, g.counts, g.centroids, 8)
    assert torch.equal(perm, spec)
    assert torch.equal(perm.sort(-1).values, torch.arange(v.shape[2], dtype=torch.int32).expand_as(perm))
    bins = grouping_within.token_bins(v, g.labels, g.counts, g.centroids, 8)
    key = (g.labels.long() * 8 + bins).gather(-1, perm.long())
    assert (key.diff(dim=-1) >= 0).all()
    same = key.diff(dim=-1) == 0
    assert (perm.diff(dim=-1)[same] > 0).all()  # stable: token order inside a bin
    assert bins.unique().numel() > 4  # the bins are used, not all zero
    plain = grouping.group_tokens(v, 8, 2).perm()
    assert not torch.equal(perm, plain)


def test_reuse_recomputes_the_bins_from_the_calls_v_and_keeps_the_centroids():
    v = clustered(seed=1)
    g = grouping.group_tokens(v, 8, 1, within_bins=4)
    fresh = g.perm()
    g.compact_centroids().drop_centroids()
    assert g.has_centroids  # the reuse steps need them
    with pytest.raises(ValueError, match="needs the V of the call"):
        g.perm()
    again = g.perm(v)
    assert torch.equal(again, grouping_within.within_perm(v, g.labels, g.counts, g.warm_centroids(), 4))
    # the E4M3 centroids move a few edge tokens at most; the clusters stay where they were
    assert torch.equal(g.labels.gather(-1, again.long()), g.labels.gather(-1, fresh.long()))
    later = v + 0.5 * torch.randn_like(v)
    assert not torch.equal(g.perm(later), again)  # the bins follow the new V


def test_within_bins_needs_the_chain_order():
    with pytest.raises(ValueError, match="order_clusters"):
        grouping.group_tokens(clustered(), 8, 1, order_clusters=False, within_bins=4)


def test_the_default_bins_follow_default_within_bins_with_the_chain_order_only(monkeypatch):
    v = clustered(n=300, seed=2)
    assert grouping.group_tokens(v, 8, 1).within_bins == grouping.DEFAULT_WITHIN_BINS
    monkeypatch.setattr(grouping, "DEFAULT_WITHIN_BINS", 8)
    assert grouping.group_tokens(v, 8, 1).within_bins == 8
    unordered = grouping.group_tokens(v, 8, 1, order_clusters=False)  # the reference's permutation exactly
    assert unordered.within_bins == 0
    assert torch.equal(unordered.perm(), grouping.permutation_from_labels(unordered.labels, 8))
