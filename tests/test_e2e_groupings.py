"""The e2e bench's per-layer grouping cache (commands/bench_e2e.LayerGroupings) reuses groupings as the node does."""
import torch

from vc_attention.commands.bench_e2e import LayerGroupings
from vc_attention.kernels import grouping_within


def test_reuse_steps_ask_the_cached_grouping_for_the_calls_permutation():
    gen = torch.Generator().manual_seed(0)
    layers = [torch.randn(1, 2, 300, 16, generator=gen) + 3 * torch.randn(1, 2, 1, 16, generator=gen) for _ in range(2)]
    groups = LayerGroupings(8, 1, within_bins=4)
    first = [groups.perm_for(v) for v in layers]  # the grouping forward
    groups.recompute, groups.calls = False, 0
    later = [v + 0.5 * torch.randn(v.shape, generator=gen) for v in layers]  # the next step's V
    reused = [groups.perm_for(v) for v in later]
    assert groups.calls == 2 and len(groups.groupings) == 2
    for v, perm, g, fresh in zip(later, reused, groups.groupings.values(), first):
        assert torch.equal(perm, grouping_within.within_perm(v, g.labels, g.counts, g.warm_centroids(), 4))
        assert torch.equal(g.labels.gather(-1, perm.long()), g.labels.gather(-1, fresh.long()))  # same clusters
    plain = LayerGroupings(8, 1)
    perm = plain.perm_for(layers[0])
    plain.recompute, plain.calls = False, 0
    assert torch.equal(plain.perm_for(later[0]), perm)  # no bins: the label order, whatever the V
