"""GPU tier of kernels/grouping.py: the CUDA path (one-hot products, 16-bit operands with float32
results, radix-sort permutation) against the reference, and a CUDA-graph capture of the grouping."""
import pytest
import torch

from vc_attention.kernels import grouping
from vc_attention.kernels import reference as ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def clustered_v(b, h, n, d, centres=24, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    mu = 3.0 * torch.randn(b, h, centres, d, generator=gen)
    pick = torch.randint(0, centres, (b, h, n), generator=gen)
    v = torch.gather(mu, 2, pick.unsqueeze(-1).expand(-1, -1, -1, d)) + torch.randn(b, h, n, d, generator=gen)
    return v.to(device="cuda", dtype=dtype)


def inertia(v, labels, centroids):
    """Mean squared distance of each token to its assigned centroid (float64)."""
    chosen = torch.gather(centroids.double(), 2, labels.unsqueeze(-1).expand(-1, -1, -1, v.shape[-1]))
    return (v.double() - chosen).square().sum(-1).mean().item()


def test_fp32_matches_reference_on_gpu():
    v = clustered_v(2, 3, 3001, 64)
    labels, centroids = grouping.kmeans(v, 32, 4, seed=1)
    ref_labels, ref_centroids = ref.kmeans_labels(v, 32, 4, seed=1)
    # cuBLAS sums in another order than the reference's product: a rare near-tie flip moves two
    # centroids a little, so compare labels and clustering quality rather than centroids
    assert (labels == ref_labels).float().mean().item() >= 0.995
    assert inertia(v, labels, centroids) <= 1.001 * inertia(v, ref_labels, ref_centroids)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_path_matches_reference_up_to_near_ties(dtype):
    v = clustered_v(1, 4, 8191, 128, dtype=dtype)
    assert grouping._work_dtype(v) == dtype  # the tensor-core path is what runs here
    labels, centroids = grouping.kmeans(v, 64, 4)
    ref_labels, ref_centroids = ref.kmeans_labels(v.float(), 64, 4)
    # near-tie flips over 4 iterations move ~1-2% of labels (CPU emulation: 97.7% equal on this
    # data in bf16, 99.2% in fp16) but not the quality: same inertia within 0.1%
    assert (labels == ref_labels).float().mean().item() >= 0.9
    assert inertia(v, labels, centroids) <= 1.001 * inertia(v, ref_labels, ref_centroids)
    # one assignment to the same (16-bit rounded) centroids is exact up to float32 summation order
    one = grouping._assign(*grouping._augment(v.flatten(0, 1)), ref_centroids.flatten(0, 1), 128)
    expected = ref.kmeans_assign(v.float(), ref_centroids.to(dtype).float()).flatten(0, 1)
    assert (one == expected).float().mean().item() >= 0.999


@pytest.mark.parametrize("n", [1, 77, 129, 4097, 75600])
def test_permutation_on_gpu_is_the_reference_stable_sort(n):
    for clusters in (64, 1000):
        labels = torch.randint(0, clusters, (2, 5, n), device="cuda")
        perm = grouping.permutation_from_labels(labels, clusters)
        assert perm.dtype == torch.int32 and perm.device.type == "cuda"
        assert torch.equal(perm.long(), ref.labels_to_permutation(labels))


def test_group_tokens_on_gpu_and_warm_start():
    v0 = clustered_v(1, 2, 5000, 128, dtype=torch.bfloat16)
    v1 = (v0.float() + 0.05 * torch.randn_like(v0, dtype=torch.float32)).to(torch.bfloat16)
    first = grouping.group_tokens(v0, 64, 4)
    warm = grouping.group_tokens(v1, 64, 1, warm_start=first)
    assert warm.labels.dtype == torch.uint8 and warm.labels.is_cuda
    assert torch.equal(warm.counts.sum(-1), torch.full((1, 2), 5000, dtype=torch.int32, device="cuda"))
    perm = warm.perm().long()
    assert torch.equal(perm.sort(-1).values, torch.arange(5000, device="cuda").expand(1, 2, 5000))


def test_grouping_capture_in_a_cuda_graph():
    """k-means, cluster ordering and permutation replay from a CUDA graph with new V."""
    static_v = clustered_v(1, 4, 4097, 128, seed=0, dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: caches the init indices, allocator pools
        grouping.group_tokens(static_v, 64, 3).perm()
    torch.cuda.current_stream().wait_stream(stream)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = grouping.group_tokens(static_v, 64, 3)
        captured_perm = captured.perm()

    fresh = clustered_v(1, 4, 4097, 128, seed=5, dtype=torch.bfloat16)
    static_v.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    eager = grouping.group_tokens(fresh, 64, 3)
    assert torch.equal(captured.labels, eager.labels)
    assert torch.equal(captured_perm, eager.perm())


def test_wan_720p_sequence_length():
    """A full-length Wan2.2 720p sequence (N = 75600) on a few heads, default settings."""
    v = clustered_v(1, 4, 75600, 128, dtype=torch.bfloat16)
    g = grouping.group_tokens(v, grouping.DEFAULT_CLUSTERS, grouping.DEFAULT_ITERS, order_clusters=False)
    ref_labels, _ = ref.kmeans_labels(v.float(), grouping.DEFAULT_CLUSTERS, grouping.DEFAULT_ITERS)
    assert (g.labels.long() == ref_labels).float().mean().item() >= 0.9
    assert torch.equal(g.perm().long(), ref.labels_to_permutation(g.labels.long()))
