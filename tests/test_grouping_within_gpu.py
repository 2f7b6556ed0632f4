"""GPU tier of the within-cluster order kernel (csrc/grouping_refine.cuh) against its spec
(kernels/grouping_within.py).

On integer-valued V and centroids every key is an exact float32 integer in the kernel and in torch, so
the permutations must be equal bit for bit; on real-valued data the kernel's dot products are summed in
another order, so a token within float rounding of a bin edge may sit in the neighbouring bin (checked
with that tolerance). Each test proves the kernel ran (grouping_fused.PATH_CALLS)."""
import pytest
import torch

from vc_attention.kernels import grouping, grouping_fused, grouping_within

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EDGE = 1e-3  # |f - round(f)| below this (in bins) may round either way in the kernel


def kernel_calls() -> int:
    return grouping_fused.PATH_CALLS["fused: within-cluster order"]


def integer_case(b, h, n, d, clusters, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    v = torch.randint(-8, 9, (b, h, n, d), generator=gen).float()
    labels = torch.randint(0, clusters, (b, h, n), generator=gen)
    labels[..., 0] = 0  # at least one cluster present; some ids stay empty at small n
    counts = torch.zeros(b, h, clusters, dtype=torch.int32).scatter_add_(-1, labels, torch.ones_like(labels, dtype=torch.int32))
    centroids = torch.randint(-8, 9, (b, h, clusters, d), generator=gen).to(torch.float16)
    perm = torch.sort(labels, dim=-1, stable=True).indices.to(torch.int32)
    return (v.to("cuda", dtype), labels.to("cuda", torch.uint8), counts.cuda(), centroids.cuda(), perm.cuda())


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bins", [2, 16, 32])
def test_refine_equals_the_spec_on_integer_data(d, dtype, bins):
    v, labels, counts, centroids, perm = integer_case(2, 3, 3000, d, 40, dtype, seed=bins + d)
    before = kernel_calls()
    out = grouping_fused.refine_perm(v, perm, counts, centroids, bins)
    assert kernel_calls() == before + 1
    spec = grouping_within.within_perm(v, labels, counts, centroids, bins)
    assert torch.equal(out, spec)


def test_refine_reads_strided_v():
    v, labels, counts, centroids, perm = integer_case(1, 4, 2048, 128, 32, torch.bfloat16, seed=3)
    bnhd = v.transpose(1, 2).contiguous().transpose(1, 2)  # (B,H,N,D) view of (B,N,H,D) memory
    assert not bnhd.is_contiguous()
    spec = grouping_within.within_perm(v, labels, counts, centroids, 16)
    assert torch.equal(grouping_fused.refine_perm(bnhd, perm, counts, centroids, 16), spec)


def assert_sorted_up_to_edges(v, g, perm, bins):
    """perm is a permutation sorted by (label, spec bin), stable, except tokens within EDGE of a bin edge."""
    n = v.shape[2]
    assert torch.equal(perm.sort(-1).values, torch.arange(n, dtype=torch.int32, device=v.device).expand_as(perm))
    labels = g.labels.long()
    assert (labels.gather(-1, perm.long()).diff(dim=-1) >= 0).all()
    direction = grouping_within.chain_directions(g.centroids.double(), g.counts)
    keys = torch.stack([torch.stack([(v[i, j].double() * direction[i, j][labels[i, j]]).sum(-1)
                                     for j in range(v.shape[1])]) for i in range(v.shape[0])])
    shape = (*labels.shape[:-1], g.counts.shape[-1])
    lo = torch.full(shape, float("inf"), dtype=torch.float64, device=v.device).scatter_reduce(-1, labels, keys, "amin")
    hi = torch.full(shape, float("-inf"), dtype=torch.float64, device=v.device).scatter_reduce(-1, labels, keys, "amax")
    f = (keys - lo.gather(-1, labels)) * bins / (hi - lo).gather(-1, labels).clamp(min=1e-30)
    edge = ((f - f.round()).abs() < EDGE) & (f > EDGE) & (f < bins - EDGE)
    spec_bin = f.floor().clamp(0, bins - 1)
    key = (labels * bins + spec_bin).gather(-1, perm.long())
    clear = ~edge.gather(-1, perm.long())
    for row_key, row_clear, row_perm in zip(key.flatten(0, 1), clear.flatten(0, 1), perm.flatten(0, 1)):
        k, p = row_key[row_clear], row_perm[row_clear]
        assert (k.diff() >= 0).all()
        assert (p.diff()[k.diff() == 0] > 0).all()
    assert edge.float().mean() < 0.01


@pytest.mark.parametrize("d", [64, 128])
def test_group_tokens_within_bins_runs_the_kernel_and_sorts_by_bin(d):
    from vc_attention.study.videodata import video_like_qkv

    v = video_like_qkv(B=1, H=2, T=2, Hgrid=30, Wgrid=52, D=d, dtype=torch.bfloat16, device="cuda")[2]
    before, fused = kernel_calls(), grouping_fused.PATH_CALLS["fused"]
    g = grouping.group_tokens(v, 64, 1, within_bins=16)
    perm = g.perm()
    assert kernel_calls() == before + 1 and grouping_fused.PATH_CALLS["fused"] == fused + 1
    assert_sorted_up_to_edges(v, g, perm, 16)
    # a reuse step (the cached labels and centroids, the same V): the same permutation
    again = g.perm(v)
    assert kernel_calls() == before + 2
    assert torch.equal(again, perm)
