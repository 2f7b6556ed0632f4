"""The grouping study's within-cluster orders and grouping parser (study/within_cluster_order.py,
bench/fidelity_study.py)."""
import argparse

import pytest
import torch

from vc_attention.bench.fidelity_study import Grouping, grouping_permutation, parse_grouping
from vc_attention.kernels import reference as ref
from vc_attention.study import within_cluster_order as wco


def _data(n=700, clusters=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(1, 2, n, 16, generator=gen) + 3.0 * torch.randn(1, 2, 1, 16, generator=gen)
    labels, _ = ref.kmeans_labels(v, clusters, 2, seed)
    return v, labels


def test_none_is_the_reference_permutation():
    v, labels = _data()
    assert torch.equal(wco.permutation(v, labels, 8, "none"), ref.labels_to_permutation(labels))


@pytest.mark.parametrize("order", ["norm", "chain", "chain8", "pca"])
def test_orders_keep_clusters_contiguous_and_sort_by_the_key(order):
    v, labels = _data()
    perm = wco.permutation(v, labels, 8, order)
    assert torch.equal(perm.sort(-1).values, torch.arange(v.shape[2]).expand(1, 2, -1))  # a permutation
    sorted_labels = torch.gather(labels, -1, perm)
    assert torch.equal(sorted_labels, labels.sort(-1).values)  # clusters stay whole, in id order
    key = torch.gather(wco.secondary_key(v, labels, 8, order), -1, perm)
    same = sorted_labels[..., 1:] == sorted_labels[..., :-1]
    assert bool((key[..., 1:] >= key[..., :-1])[same].all())
    assert not torch.equal(perm, ref.labels_to_permutation(labels))  # the key did reorder


def test_chain_bins_cut_each_clusters_chain_key_range_into_equal_bins():
    v, labels = _data()
    key = wco.secondary_key(v, labels, 8, "chain")
    bins = wco.secondary_key(v, labels, 8, "chain4")
    assert set(bins.unique().tolist()) == {0.0, 1.0, 2.0, 3.0}
    for c in range(8):
        for h in range(2):
            k, b = key[0, h][labels[0, h] == c], bins[0, h][labels[0, h] == c]
            frac = (k - k.min()) / (k.max() - k.min())
            assert torch.equal(b, torch.clamp(torch.floor(frac * 4), 0, 3))  # the bins follow the chain key
            assert b[k.argmin()] == 0 and b[k.argmax()] == 3


def test_pca_direction_is_the_principal_axis():
    gen = torch.Generator().manual_seed(3)
    axis = torch.nn.functional.normalize(torch.randn(16, generator=gen), dim=0)
    x = (torch.randn(1, 1, 500, 1, generator=gen) * 5.0 * axis + 0.1 * torch.randn(1, 1, 500, 16, generator=gen))
    labels = torch.zeros(1, 1, 500, dtype=torch.long)
    means = wco.cluster_means(x, labels, 1)
    u = wco.principal_directions(x, labels, means, torch.randn(1, 1, 1, 16, generator=gen))
    assert abs(float(u[0, 0, 0] @ axis)) > 0.999


def test_parse_grouping():
    assert parse_grouping("128x4:chain:pca") == Grouping(128, 4, "chain", "pca")
    assert parse_grouping("64x2") == Grouping(64, 2, "chain", "none")
    for bad in ("64", "64x2:ids", "64x2:chain:random"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_grouping(bad)
    with pytest.raises(ValueError):
        wco.secondary_key(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, dtype=torch.long), 1, "random")


def test_study_default_grouping_is_the_reference():
    v, _ = _data(clusters=64)
    labels, _ = ref.kmeans_labels(v, 64, 2, 0)
    assert torch.equal(grouping_permutation(v, Grouping(), 0), ref.labels_to_permutation(labels))
