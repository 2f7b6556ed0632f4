"""CPU tests of kernels/grouping_order.py: the nearest-neighbour chain that renumbers clusters."""
import torch

from vc_attention.kernels.grouping_order import chain_ranks


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
