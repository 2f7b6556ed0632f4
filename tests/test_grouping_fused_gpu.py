"""GPU tier of the fused grouping kernels (kernels/grouping_fused.py, csrc/grouping.cuh) against the
grouping semantics of kernels/reference.py and kernels/grouping_order.py.

Tolerance: a label may differ from the reference only where the reference's distances of that token
to the two centroids are equal up to float32 rounding (NEAR_TIE below); with several k-means rounds
such a flip moves two centroids a little, so there the clustering quality is compared instead.
Every test first checks that the fused path ran: the torch implementation is patched to raise."""
import pytest
import torch

from vc_attention.kernels import grouping, grouping_fused
from vc_attention.kernels import reference as ref
from vc_attention.kernels.grouping_order import chain_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NEAR_TIE = 2.0**-16  # relative to the magnitudes a float32 distance is summed from


@pytest.fixture(autouse=True)
def fused_only(monkeypatch):
    """Any call that reaches the torch implementation fails the test."""

    def torch_path(*args, **kwargs):
        raise AssertionError("the torch grouping ran; the fused path was expected")

    monkeypatch.setattr(grouping, "_torch_kmeans", torch_path)
    before = fused_calls()
    yield
    assert fused_calls() > before


def fused_calls() -> int:
    """Calls on any fused path: the k-means grouping and a cached grouping's permutation."""
    return grouping_fused.PATH_CALLS["fused"] + grouping_fused.PATH_CALLS["fused: reuse permutation"]


def clustered_v(b, h, n, d, centres=24, seed=0, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    mu = 3.0 * torch.randn(b, h, centres, d, generator=gen)
    pick = torch.randint(0, centres, (b, h, n), generator=gen)
    v = torch.gather(mu, 2, pick.unsqueeze(-1).expand(-1, -1, -1, d)) + torch.randn(b, h, n, d, generator=gen)
    return v.to(device="cuda", dtype=dtype)


def video_v(d=128, dtype=torch.bfloat16):
    from vc_attention.study.videodata import video_like_qkv

    return video_like_qkv(B=1, H=2, T=2, Hgrid=30, Wgrid=52, D=d, dtype=dtype, device="cuda")[2]


def assert_labels_match_up_to_near_ties(v, centroids, labels, ref_labels):
    """Where the labels differ, the float64 distances to both centroids agree to float32 rounding."""
    x = v.double()
    c = centroids.double()
    differ = labels != ref_labels
    if not differ.any():
        return
    idx = differ.nonzero(as_tuple=True)
    xs = x[idx[0], idx[1], idx[2]]
    ca = c[idx[0], idx[1], labels[differ]]
    cb = c[idx[0], idx[1], ref_labels[differ]]
    score_a = ca.square().sum(-1) - 2.0 * (xs * ca).sum(-1)
    score_b = cb.square().sum(-1) - 2.0 * (xs * cb).sum(-1)
    scale = ca.square().sum(-1) + cb.square().sum(-1) + 2.0 * xs.norm(dim=-1) * (ca.norm(dim=-1) + cb.norm(dim=-1))
    worst = ((score_a - score_b).abs() / scale).max().item()
    assert worst <= NEAR_TIE, f"{differ.sum().item()} labels differ, worst relative gap {worst:.2e}"


def inertia(v, labels, centroids):
    chosen = torch.gather(centroids.double(), 2, labels.unsqueeze(-1).expand(-1, -1, -1, v.shape[-1]))
    return (v.double() - chosen).square().sum(-1).mean().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [1, 77, 129, 4097])
def test_one_assignment_is_the_reference_up_to_near_ties(dtype, d, n):
    v = clustered_v(2, 3, n, d, dtype=dtype)
    clusters = 64
    c = min(clusters, n)
    start = v.float()[:, :, ref.kmeans_init_indices(n, clusters, 2).to("cuda")] + 0.01 * torch.randn(2, 3, c, d, device="cuda")
    labels, centroids = grouping.kmeans(v, clusters, 0, init_centroids=start)
    assert labels.shape == (2, 3, n) and labels.dtype == torch.int64
    assert torch.equal(centroids, start)  # no round: centroids untouched
    assert_labels_match_up_to_near_ties(v.float(), start, labels, ref.kmeans_assign(v.float(), start))


@pytest.mark.parametrize("tensor_cores", [True, False])
@pytest.mark.parametrize("d", [64, 128])
def test_both_bf16_passes_are_the_reference_up_to_near_ties(monkeypatch, tensor_cores, d):
    """The tensor-core pass (bf16 MMA over split centroids) and the FP32 pass, proven by the counter."""
    monkeypatch.setattr(grouping_fused, "TENSOR_CORES", tensor_cores)
    v = clustered_v(2, 3, 4097, d)
    start = v.float()[:, :, ref.kmeans_init_indices(4097, 64, 1).to("cuda")] + 0.01 * torch.randn(2, 3, 64, d, device="cuda")
    before = grouping_fused.PATH_CALLS["fused: tensor cores"]
    labels, _ = grouping.kmeans(v, 64, 0, init_centroids=start)
    assert grouping_fused.PATH_CALLS["fused: tensor cores"] == before + int(tensor_cores)
    assert_labels_match_up_to_near_ties(v.float(), start, labels, ref.kmeans_assign(v.float(), start))


@pytest.mark.parametrize("d", [64, 128])
def test_tensor_cores_tell_apart_centroids_equal_in_bf16(d):
    """Two centroids m +- e with e below bf16's resolution: only the lower bf16 terms of the split
    separate them, and every token's side is decided by its noise along e (gaps far above rounding)."""
    gen = torch.Generator().manual_seed(3)
    m = torch.randn(d, generator=gen).bfloat16().float()
    e = m.abs() * 2.0**-10 * torch.randn(d, generator=gen).sign()
    start = torch.stack([m + e, m - e]).expand(1, 2, 2, d).contiguous().to("cuda")
    assert torch.equal(start[:, :, 0].bfloat16(), start[:, :, 1].bfloat16())  # one bf16 term: a tie
    v = (m + 4.0 * torch.randn(1, 2, 3000, d, generator=gen)).to(device="cuda", dtype=torch.bfloat16)
    before = grouping_fused.PATH_CALLS["fused: tensor cores"]
    labels, _ = grouping.kmeans(v, 2, 0, init_centroids=start)
    assert grouping_fused.PATH_CALLS["fused: tensor cores"] == before + 1
    assert 0.3 <= labels.float().mean().item() <= 0.7  # both sides taken, as the noise is symmetric
    assert_labels_match_up_to_near_ties(v.float(), start, labels, ref.kmeans_assign(v.float(), start))


@pytest.mark.parametrize("d", [64, 128])
def test_one_update_is_the_reference_mean(d):
    v = clustered_v(1, 4, 3001, d)
    start = v.float()[:, :, ref.kmeans_init_indices(3001, 64, 0).to("cuda")]
    first, _ = grouping.kmeans(v, 64, 0, init_centroids=start)
    _, centroids = grouping.kmeans(v, 64, 1, init_centroids=start)
    expected = ref.kmeans_update(v.float(), first, start)  # the mean of the clusters the kernel formed
    torch.testing.assert_close(centroids, expected, rtol=1e-5, atol=1e-5)


def test_empty_clusters_keep_their_centroid():
    v = clustered_v(1, 2, 500, 128)
    start = v.float()[:, :, :8].clone()
    start[:, :, 5] = 1e4  # far from every token: stays empty
    _, centroids = grouping.kmeans(v, 8, 2, init_centroids=start)
    assert torch.equal(centroids[:, :, 5], start[:, :, 5])


@pytest.mark.parametrize("tensor_cores", [True, False])
@pytest.mark.parametrize("data", ["clustered", "video"])
def test_kmeans_rounds_match_the_reference_quality(monkeypatch, data, tensor_cores):
    monkeypatch.setattr(grouping_fused, "TENSOR_CORES", tensor_cores)
    v = clustered_v(1, 4, 8191, 128) if data == "clustered" else video_v()
    labels, centroids = grouping.kmeans(v, 64, 2)
    ref_labels, ref_centroids = ref.kmeans_labels(v.float(), 64, 2)
    assert (labels == ref_labels).float().mean().item() >= 0.99
    assert inertia(v, labels, centroids) <= 1.001 * inertia(v, ref_labels, ref_centroids)
    assert ((centroids - ref_centroids).norm() / ref_centroids.norm()).item() <= 1e-2


def test_results_are_bit_identical_run_to_run():
    v = clustered_v(2, 5, 20000, 128)
    a, b = grouping.group_tokens(v, 64, 2), grouping.group_tokens(v, 64, 2)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.centroids, b.centroids)
    assert torch.equal(a.perm(), b.perm())


def assert_same_chain_up_to_near_ties(centroids, counts, rank, expected):
    """Equal chains, or chains that first part where two steps are equally far up to rounding."""
    if torch.equal(rank, expected):
        return
    ours, theirs = rank.argsort(), expected.argsort()  # cluster visited at each step
    step = int((ours != theirs).nonzero()[0])
    c = centroids.double()
    if step == 0:  # the start: farthest non-empty cluster from the count-weighted mean
        w = counts.double().unsqueeze(-1)
        mean = (c * w).sum(0) / w.sum().clamp(min=1.0)
        a, b = (c[ours[0]] - mean).square().sum(), (c[theirs[0]] - mean).square().sum()
        scale = a + b
    else:
        prev = c[ours[step - 1]]
        a, b = (c[ours[step]] - prev).square().sum(), (c[theirs[step]] - prev).square().sum()
        scale = 2.0 * (prev.square().sum() + c[ours[step]].square().sum() + c[theirs[step]].square().sum())
    assert ((a - b).abs() / scale).item() <= NEAR_TIE, f"the chains part at step {step} without a near tie"


@pytest.mark.parametrize("order", [True, False])
@pytest.mark.parametrize("n", [1, 77, 129, 4097, 75600])
def test_order_and_permutation(order, n):
    v = clustered_v(1, 3, n, 128)
    start = grouping._initial_centroids(v, 64, 0, None)
    out = grouping_fused.run(v, start, 2, order)
    raw, c = out["raw_labels"].long(), out["centroids"].shape[2]
    raw_counts = grouping._cluster_counts(raw, c)
    rank = out["rank"].long()
    if order:
        expected = chain_ranks(out["centroids"].view(3, c, 128), raw_counts.view(3, c)).view(1, 3, c)
        for head in range(3):
            assert_same_chain_up_to_near_ties(out["centroids"][0, head], raw_counts[0, head], rank[0, head], expected[0, head])
    else:
        assert torch.equal(rank, torch.arange(c, device="cuda").expand(1, 3, c))
    labels = torch.gather(rank, -1, raw)
    assert torch.equal(out["labels"].long(), labels)
    assert torch.equal(out["counts"], torch.empty_like(raw_counts).scatter_(-1, rank, raw_counts))
    moved = torch.empty_like(out["centroids"]).scatter_(2, rank.unsqueeze(-1).expand(-1, -1, -1, 128), out["centroids"])
    assert torch.equal(out["centroids_fp16"], moved.clamp(-65504, 65504).half())
    # the stable sort by new label: equal labels contiguous, in cluster order, tokens in order
    assert torch.equal(out["perm"].long(), ref.labels_to_permutation(labels))


@pytest.mark.parametrize("clusters", [20, 64, 100, 128, 160])
@pytest.mark.parametrize("d", [64, 128])
def test_chain_order_for_each_threads_per_cluster_split(clusters, d):
    """The order kernel's chain splits each cluster's dot product over 4 threads (<= 64 clusters), 2
    (<= 128) or 1 (more; the default build runs the <= 64 case in one warp instead: VC_GROUP_ORDER_WARP): every form
    gives the chain of grouping_order.chain_ranks (up to near ties)."""
    v = clustered_v(1, 2, 4097, d)
    start = grouping._initial_centroids(v, clusters, 0, None)
    out = grouping_fused.run(v, start, 1, True)
    raw, c = out["raw_labels"].long(), out["centroids"].shape[2]
    counts = grouping._cluster_counts(raw, c)
    expected = chain_ranks(out["centroids"].view(2, c, d), counts.view(2, c)).view(1, 2, c)
    for head in range(2):
        assert_same_chain_up_to_near_ties(out["centroids"][0, head], counts[0, head], out["rank"].long()[0, head],
                                          expected[0, head])


def test_group_tokens_bnhd_view_batch_two_and_warm_start():
    bnhd = clustered_v(2, 4, 3000, 64).transpose(1, 2).contiguous()  # (B,N,H,D) as models hold it
    v = bnhd.transpose(1, 2)
    first = grouping.group_tokens(v, 64, 2)
    assert first.labels.dtype == torch.uint8 and first.centroids.dtype == torch.float16
    assert torch.equal(first.counts.sum(-1), torch.full((2, 4), 3000, dtype=torch.int32, device="cuda"))
    perm = first.perm()
    assert first.fresh_perm is None  # handed out once, not kept in the cache
    assert torch.equal(perm, grouping.permutation_from_labels(first.labels, 64))
    # a warm start assigns to the cached (fp16) centroids
    labels, _ = grouping.kmeans(v, 64, 0, init_centroids=first.centroids)
    start = first.centroids.float()
    assert_labels_match_up_to_near_ties(v.float(), start, labels, ref.kmeans_assign(v.float(), start))
    warm = grouping.group_tokens(v, 64, 1, warm_start=first)
    assert torch.equal(warm.counts.sum(-1), first.counts.sum(-1))


def test_more_clusters_than_tokens_and_256_clusters():
    few = grouping.group_tokens(clustered_v(1, 2, 40, 128), 64, 2)
    assert few.counts.shape == (1, 2, 40) and few.labels.dtype == torch.uint8
    many = grouping.group_tokens(clustered_v(1, 2, 5000, 64), 256, 2)
    assert many.counts.shape == (1, 2, 256)
    assert torch.equal(many.perm(), grouping.permutation_from_labels(many.labels, 256))


def test_capture_in_a_cuda_graph():
    """k-means, order and permutation replay from a CUDA graph with new V, bit-identical to eager."""
    static_v = clustered_v(1, 4, 4097, 128, seed=0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: build, init indices, shared-memory opt-in, pools
        grouping.group_tokens(static_v, 64, 2).perm()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = grouping.group_tokens(static_v, 64, 2)
        captured_perm = captured.perm()
    fresh = clustered_v(1, 4, 4097, 128, seed=5)
    static_v.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    eager = grouping.group_tokens(fresh, 64, 2)
    assert torch.equal(captured.labels, eager.labels)
    assert torch.equal(captured_perm, eager.perm())


def test_v_term_error_not_worse_than_the_torch_grouping(monkeypatch):
    """The quality measure of docs/grouping.md (bench/grouping_sweep.py) on video-like data."""
    from vc_attention.bench.grouping_sweep import exact_probabilities, v_term_error
    from vc_attention.study.videodata import video_like_qkv

    q, k, v = video_like_qkv(B=1, H=2, T=2, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, device="cuda")
    rows = torch.randperm(v.shape[2], generator=torch.Generator().manual_seed(0))[:256].to("cuda")
    p = exact_probabilities(q.float(), k.float(), rows)
    fused = v_term_error(p, v.float(), grouping.group_tokens(v, 64, 2).perm())
    monkeypatch.undo()  # the torch implementation for the comparison
    monkeypatch.setattr(grouping_fused, "unsupported_reason", lambda *a: "comparison run")
    torch_path = v_term_error(p, v.float(), grouping.group_tokens(v, 64, 2).perm())
    assert fused <= 1.01 * torch_path, (fused, torch_path)


def _cached(labels, clusters):
    counts = grouping._cluster_counts(labels.long(), clusters)
    return grouping.CompactGrouping(labels=labels.to(torch.uint8), counts=counts)


@pytest.mark.parametrize(
    "b,h,n,clusters",
    [(1, 2, 4097, 64), (2, 12, 32760, 64), (1, 3, 40, 20), (1, 2, 5000, 256), (2, 1, 63, 1), (1, 4, 129, 128)],
)
def test_a_cached_grouping_permutes_on_the_gpu_as_the_stable_sort(b, h, n, clusters):
    """The reuse steps' permutation (grouping_fused.permute_labels: label counts + the permutation
    kernel) is torch's stable sort of the labels, bit for bit, and ran on the fused path."""
    gen = torch.Generator().manual_seed(n)
    labels = torch.randint(0, clusters, (b, h, n), generator=gen)
    labels[:, 0, : n // 2] = clusters - 1  # long runs of one label, and (for > 1 cluster) a skewed head
    cached = _cached(labels.cuda(), clusters)
    before = grouping_fused.PATH_CALLS["fused: reuse permutation"]
    perm = cached.perm()
    assert grouping_fused.PATH_CALLS["fused: reuse permutation"] == before + 1
    assert perm.dtype == torch.int32 and perm.shape == (b, h, n)
    assert torch.equal(perm.long().cpu(), ref.labels_to_permutation(labels))


def test_the_reuse_permutation_replays_from_a_cuda_graph():
    labels = torch.randint(0, 64, (2, 12, 32760), generator=torch.Generator().manual_seed(1)).cuda()
    cached = _cached(labels, 64)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cached.perm()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = cached.perm()
    fresh = torch.randint(0, 64, labels.shape, generator=torch.Generator().manual_seed(2)).cuda()
    cached.labels.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.long().cpu(), ref.labels_to_permutation(fresh.cpu()))


@pytest.mark.parametrize("variant", [name for name in grouping_fused.VARIANTS if name != "default"])
@pytest.mark.parametrize("clusters,d", [(20, 128), (64, 128), (64, 64), (100, 64)])
def test_each_build_variant_groups_bit_for_bit_as_the_default(variant, clusters, d, monkeypatch):
    """grouping_fused.VARIANTS change how the chain order is computed, never its result: the same
    rank, labels, counts, fp16 centroids and permutation as the default build."""
    v = clustered_v(2, 3, 5000, d, seed=clusters)
    start = grouping._initial_centroids(v, clusters, 0, None)
    outs = {}
    for build in ("default", variant):
        monkeypatch.setattr(grouping_fused, "BUILD", build)
        outs[build] = grouping_fused.run(v, start.clone(), 1, True)
    for name in ("rank", "counts", "labels", "perm", "centroids_fp16", "raw_labels"):
        assert torch.equal(outs["default"][name], outs[variant][name]), name
