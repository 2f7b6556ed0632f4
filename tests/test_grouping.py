"""CPU tests of kernels/grouping.py (against the grouping semantics in kernels/reference.py) and of
kernels/grouping_order.py (the cluster renumbering)."""
import re
from pathlib import Path

import pytest
import torch

from vc_attention.kernels import grouping
from vc_attention.kernels import reference as ref
from vc_attention.kernels.grouping_order import chain_ranks


def clustered_v(b=1, h=2, n=600, d=32, centres=6, seed=0):
    """Tokens drawn around a few centres per head, in random token order (like video V)."""
    gen = torch.Generator().manual_seed(seed)
    mu = 4.0 * torch.randn(b, h, centres, d, generator=gen)
    pick = torch.randint(0, centres, (b, h, n), generator=gen)
    return torch.gather(mu, 2, pick.unsqueeze(-1).expand(-1, -1, -1, d)) + torch.randn(b, h, n, d, generator=gen)


def agreement(a, b):
    return (a == b).float().mean().item()


def inertia(x, labels, centroids):
    """Mean squared distance of each token to its assigned centroid (float64), (G,N,D) inputs."""
    chosen = torch.gather(centroids.double(), 1, labels.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return (x.double() - chosen).square().sum(-1).mean().item()


@pytest.mark.parametrize("clusters,iters", [(4, 1), (16, 4), (64, 8), (300, 2)])
def test_kmeans_matches_reference(clusters, iters):
    v = clustered_v(b=2, h=2, n=700)
    labels, centroids = grouping.kmeans(v, clusters, iters, seed=3)
    ref_labels, ref_centroids = ref.kmeans_labels(v, clusters, iters, seed=3)
    assert labels.shape == ref_labels.shape and labels.dtype == torch.int64
    # same init and arithmetic: equal up to float summation order near ties (a flip would move two
    # centroids, so quality is compared rather than centroids)
    assert agreement(labels, ref_labels) >= 0.995
    g = 2 * 2
    assert inertia(v.view(g, 700, 32), labels.view(g, 700), centroids.view(g, -1, 32)) <= 1.0001 * inertia(
        v.view(g, 700, 32), ref_labels.view(g, 700), ref_centroids.view(g, -1, 32)
    )


def test_kmeans_accepts_bnhd_views_and_16bit_input():
    v = clustered_v(h=3, n=257).to(torch.bfloat16)
    as_bnhd = v.transpose(1, 2).contiguous().transpose(1, 2)  # a non-contiguous (B,H,N,D) view
    labels, _ = grouping.kmeans(as_bnhd, 8, 3)
    ref_labels, _ = ref.kmeans_labels(v.float(), 8, 3)
    assert agreement(labels, ref_labels) >= 0.995


def test_chunked_heads_give_the_same_result(monkeypatch):
    v = clustered_v(b=2, h=3, n=300)
    whole = grouping.kmeans(v, 16, 3)
    monkeypatch.setattr(grouping, "_TEMP_BYTES", 1)  # one (batch, head) group per chunk
    chunked = grouping.kmeans(v, 16, 3)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


def test_onehot_sums_equal_scatter_sums():
    """The CUDA update path (one-hot product) computes what the CPU path (scatter-add) does,
    including the cluster counts carried by the norm column."""
    x_aug, _ = grouping._augment(clustered_v(h=3, n=513).view(3, 513, 32))
    labels = torch.randint(0, 40, (3, 513), generator=torch.Generator().manual_seed(1))
    sums_a = grouping._cluster_sums_onehot(x_aug, labels, 40)
    sums_b = grouping._cluster_sums_scatter(x_aug, labels, 40)
    torch.testing.assert_close(sums_a, sums_b, rtol=1e-5, atol=1e-4)
    counts = torch.nn.functional.one_hot(labels, 40).sum(1).float()
    assert torch.equal(sums_a[..., 32], counts)


@pytest.mark.parametrize(
    "dtype,scale", [(torch.bfloat16, 1.0), (torch.float16, 1.0), (torch.float16, 150.0), (torch.float16, 0.002)]
)
def test_16bit_distance_product_is_exact_for_the_rounded_centroids(dtype, scale):
    """The tensor-core operands (16-bit x, rounded centroids, the norm split over three 16-bit
    columns) give the float32 argmin for the rounded centroids, emulated exactly on the CPU; with
    fp16 also for large and tiny values (||c||^2 ~ 1e7 and 1e-4: beyond fp16's range or precision
    without the column's power-of-two scale)."""
    x = (scale * clustered_v(h=2, n=2000, d=64)).view(2, 2000, 64).to(dtype)
    centroids = x[:, :50].float() + 0.3 * scale * torch.randn(2, 50, 64, generator=torch.Generator().manual_seed(2))
    labels = grouping._assign(*grouping._augment(x), centroids, 64)
    expected = ref.kmeans_assign(x.float(), centroids.to(dtype).float())
    assert agreement(labels, expected) >= 0.999
    # over several iterations near-tie flips change the trajectory a little, not the quality
    labels_16, centroids_16 = grouping._lloyd(x, x[:, :32].float(), 4)
    init = x[:, :32].float().unsqueeze(0)
    labels_32, centroids_32 = ref.kmeans_labels(x.float().unsqueeze(0), 32, 4, init_centroids=init)
    assert agreement(labels_16, labels_32[0]) >= 0.9
    assert inertia(x, labels_16, centroids_16) <= 1.001 * inertia(x, labels_32[0], centroids_32[0])


@pytest.mark.parametrize("n", [1, 77, 129, 4097])
def test_permutation_is_the_stable_sort_by_label(n):
    clusters = 37
    labels = torch.randint(0, clusters, (2, 3, n), generator=torch.Generator().manual_seed(n))
    perm = grouping.permutation_from_labels(labels, clusters)
    assert perm.dtype == torch.int32 and perm.shape == labels.shape
    assert torch.equal(perm.long().sort(-1).values, torch.arange(n).expand(2, 3, n))
    assert torch.equal(perm.long(), ref.labels_to_permutation(labels))
    sorted_labels = torch.gather(labels, -1, perm.long())
    assert bool((sorted_labels[..., 1:] >= sorted_labels[..., :-1]).all())
    same = sorted_labels[..., 1:] == sorted_labels[..., :-1]
    assert bool((perm[..., 1:] > perm[..., :-1])[same].all())  # stable: ties keep token order


def test_permutation_with_int16_labels():
    labels = torch.randint(0, 1000, (1, 2, 4097), generator=torch.Generator().manual_seed(0))
    perm = grouping.permutation_from_labels(labels.to(torch.int16), 1000)
    assert torch.equal(perm.long(), ref.labels_to_permutation(labels))


def test_group_tokens_compact_dtypes_counts_and_perm():
    v = clustered_v(h=2, n=400)
    small = grouping.group_tokens(v, 16, 2)
    large = grouping.group_tokens(v, 300, 1)
    assert small.labels.dtype == torch.uint8 and large.labels.dtype == torch.int16
    assert small.counts.dtype == torch.int32 and small.counts.shape == (1, 2, 16)
    assert torch.equal(small.counts.sum(-1), torch.full((1, 2), 400, dtype=torch.int32))
    assert torch.equal(small.counts, torch.nn.functional.one_hot(small.labels.long(), 16).sum(2).int())
    assert small.centroids.dtype == torch.float16 and small.centroids.shape == (1, 2, 16, 32)
    ref_labels, _ = ref.kmeans_labels(v, 16, 2)
    unordered = grouping.group_tokens(v, 16, 2, order_clusters=False)
    assert torch.equal(unordered.labels.long(), ref_labels)
    assert torch.equal(unordered.perm().long(), ref.labels_to_permutation(ref_labels))


def test_cluster_ordering_only_renames_clusters():
    v = clustered_v(h=2, n=900, centres=12)
    plain = grouping.group_tokens(v, 24, 3, order_clusters=False)
    ordered = grouping.group_tokens(v, 24, 3)
    # one new id per old id, one-to-one: a renaming
    pairs = torch.stack([plain.labels.long(), ordered.labels.long()], -1).view(2, -1, 2)
    for head in range(2):
        mapping = dict(map(tuple, pairs[head].unique(dim=0).tolist()))
        assert len(mapping) == len(set(mapping.values())) == len(pairs[head].unique(dim=0))
        for old, new in mapping.items():
            assert ordered.counts[0, head, new] == plain.counts[0, head, old]
            assert torch.equal(ordered.centroids[0, head, new], plain.centroids[0, head, old])
    assert torch.equal(ordered.perm().long(), ref.labels_to_permutation(ordered.labels.long()))


def test_nbytes_and_drop_centroids():
    g = grouping.group_tokens(clustered_v(h=2, n=300), 8, 1)
    with_centroids = 1 * 2 * 300 * 1 + 1 * 2 * 8 * 4 + 1 * 2 * 8 * 32 * 2
    assert g.nbytes == with_centroids
    assert g.drop_centroids() is g and g.centroids is None
    assert g.nbytes == with_centroids - 1 * 2 * 8 * 32 * 2
    with pytest.raises(ValueError, match="drop_centroids"):
        grouping.group_tokens(clustered_v(h=2, n=300), 8, 1, warm_start=g)


def test_warm_start_uses_previous_centroids():
    v0 = clustered_v(h=2, n=500, seed=0)
    v1 = v0 + 0.1 * torch.randn(v0.shape, generator=torch.Generator().manual_seed(9))
    first = grouping.group_tokens(v0, 12, 4)
    warm = grouping.group_tokens(v1, 12, 2, warm_start=first, order_clusters=False)
    ref_labels, ref_centroids = ref.kmeans_labels(v1, 12, 2, init_centroids=first.centroids.float())
    assert agreement(warm.labels.long(), ref_labels) >= 0.995
    torch.testing.assert_close(warm.centroids.float(), ref_centroids, rtol=2e-3, atol=2e-3)
    # zero iterations: the labels are the assignment to the previous centroids
    zero = grouping.group_tokens(v1, 12, 0, warm_start=first, order_clusters=False)
    assert torch.equal(zero.labels.long(), ref.kmeans_assign(v1, first.centroids.float()))


def test_compact_centroids_keep_e4m3_codes_and_warm_start_from_their_decoded_values():
    v0 = clustered_v(h=2, n=500, seed=0)
    v1 = v0 + 0.1 * torch.randn(v0.shape, generator=torch.Generator().manual_seed(9))
    first = grouping.group_tokens(v0, 12, 4)
    full = first.centroids.float()
    labels_bytes = first.labels.numel() + first.counts.numel() * 4
    assert first.compact_centroids() is first and first.compact_centroids() is first  # idempotent
    assert first.centroids.dtype == torch.float8_e4m3fn and first.centroid_scale.shape == (1, 2, 12, 1)
    assert first.nbytes == labels_bytes + 1 * 2 * 12 * (32 + 4)
    decoded = first.warm_centroids()
    # per centroid: its largest coordinate is 448 * scale exactly, every coordinate within half an E4M3
    # step (2^-4 relative) of the fp16 value, or within the subnormal spacing of the scale
    amax = full.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(decoded.abs().amax(-1, keepdim=True), amax, rtol=1e-6, atol=0)
    assert ((decoded - full).abs() <= full.abs() / 16 + first.centroid_scale * 2.0 ** -9).all()
    assert not torch.equal(decoded, full)  # the rounding is real: the test below would see a no-op
    zero = grouping.group_tokens(v1, 12, 0, warm_start=first, order_clusters=False)
    assert torch.equal(zero.labels.long(), ref.kmeans_assign(v1, decoded))
    assert first.drop_centroids().centroid_scale is None and first.warm_centroids() is None
    assert first.nbytes == labels_bytes


def test_warm_start_shape_mismatch_is_a_value_error():
    first = grouping.group_tokens(clustered_v(h=2, n=200), 8, 1)
    with pytest.raises(ValueError, match="warm start"):
        grouping.group_tokens(clustered_v(h=2, n=200), 16, 1, warm_start=first)


def test_empty_cluster_keeps_its_centroid():
    v = clustered_v(h=1, n=200, d=8)
    init = v[:, :, :3].clone()
    init[:, :, 2] = 1.0e4  # nothing is ever nearest to this one
    labels, centroids = grouping.kmeans(v, 3, 3, init_centroids=init)
    assert not bool((labels == 2).any())
    assert torch.equal(centroids[:, :, 2], init[:, :, 2])
    assert bool(torch.isfinite(centroids).all())
    g = grouping.group_tokens(v, 3, 0, warm_start=grouping.CompactGrouping(labels, torch.zeros(1, 1, 3), init))
    assert g.counts[0, 0, 2].item() == 0


def test_more_clusters_than_tokens():
    v = clustered_v(h=2, n=5)
    g = grouping.group_tokens(v, 64, 3)
    assert g.counts.shape == (1, 2, 5) and g.labels.dtype == torch.uint8
    assert torch.equal(g.perm().long().sort(-1).values, torch.arange(5).expand(1, 2, 5))
    one = grouping.group_tokens(clustered_v(h=2, n=1), 64, 3)
    assert torch.equal(one.perm(), torch.zeros(1, 2, 1, dtype=torch.int32))


@pytest.mark.parametrize(
    "kwargs,match",
    [({"clusters": 0, "iters": 1}, "clusters"), ({"clusters": 8, "iters": -1}, "iters")],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        grouping.kmeans(clustered_v(h=1, n=50), **kwargs)
    with pytest.raises(ValueError, match="4-D"):
        grouping.kmeans(torch.zeros(3, 4, 5), 2, 1)


def test_defaults_are_sane():
    assert 1 <= grouping.DEFAULT_CLUSTERS <= 256  # uint8 labels
    assert grouping.DEFAULT_ITERS >= 1


# ---- cluster ordering (kernels/grouping_order.py)
def test_chain_walks_collinear_centroids_from_an_end():
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([0.0, 1.0, 2.5, 3.0, 4.5, 6.0, 6.2, 9.0])
    shuffle = torch.randperm(8, generator=gen)
    direction = torch.randn(16, generator=gen)
    centroids = (positions[shuffle].unsqueeze(-1) * direction).unsqueeze(0)  # (1, 8, 16)
    rank = chain_ranks(centroids, torch.ones(1, 8))
    walked = positions[shuffle][rank[0].argsort()]
    assert torch.equal(walked, positions) or torch.equal(walked, positions.flip(0))


def test_ranks_are_a_permutation_and_empty_clusters_go_last():
    gen = torch.Generator().manual_seed(1)
    centroids = torch.randn(5, 20, 8, generator=gen)
    counts = torch.randint(0, 4, (5, 20), generator=gen)
    counts[0] = 0  # a group with no tokens at all still gets a valid numbering
    rank = chain_ranks(centroids, counts)
    assert torch.equal(rank.sort(-1).values, torch.arange(20).expand(5, 20))
    for g in range(1, 5):
        empty, filled = rank[g][counts[g] == 0], rank[g][counts[g] > 0]
        assert empty.numel() == 0 or empty.min() > filled.max()


def test_each_step_goes_to_the_nearest_unvisited_cluster():
    gen = torch.Generator().manual_seed(2)
    centroids = torch.randn(3, 12, 5, generator=gen)
    rank = chain_ranks(centroids, torch.ones(3, 12))
    for g in range(3):
        order = rank[g].argsort()
        for step in range(11):
            here, rest = centroids[g, order[step]], centroids[g, order[step + 1 :]]
            nearest = (rest - here).square().sum(-1).argmin()
            assert nearest == 0


def test_docs_snippet_runs():
    """docs/grouping.md's API example is executed, so it cannot drift from the code."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "grouping.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(code, "docs/grouping.md", "exec"), {"__name__": "docs_snippet"})
    assert f"`DEFAULT_CLUSTERS = {grouping.DEFAULT_CLUSTERS}`, `DEFAULT_ITERS = {grouping.DEFAULT_ITERS}`" in text
