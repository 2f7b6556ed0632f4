"""The attention and grouping sections of `vc-attention bench`.

Attention: per shape, every method of commands/bench_peers.py on the same random bf16 tensors
(B, H, N, D), CUDA-event median of `reps` calls after a warm-up, VC-Attention's preprocessing
included, grouping excluded (a sampling run groups only inside its grouping window). Ratios are
against cuDNN SDPA, SageAttention 2.2's `sageattn` and its portable kernel (fp32+fp16) of the same
run. Fidelity: relative L2 against float64 exact attention on video-like data of a real token
count (21 x 30 x 52 = 32,760 tokens, 2 heads, 1,024 sampled query rows), per head dim, each mode with
its preset's V-Smooth grouping (fidelity_grouping).

Grouping: k-means with the speed preset's clusters and iterations (the grouping a speed-mode run
computes) + cluster ordering + permutation per shape, with its share of the speed-mode call measured
in the same run.
"""
from __future__ import annotations

FP8_DENSE_PEAK_TOPS = 1979.0  # H100/H200 SXM dense FP8 tensor-core peak (datasheet)
# a short call repeats until its timed calls add up to this much (cuda_time_ms's min_total_ms): ten calls of
# 0.7 ms gave medians 28% apart between two runs (LTX-Video, docs/kernel-notes.md section 25)
SHORT_CALL_TOTAL_MS = 100.0
FIDELITY_GRID = (21, 30, 52)  # Wan2.1 480p latent after 1x2x2 patches: 32,760 tokens
FIDELITY_HEADS = 2
FIDELITY_ROWS = 1024


def _ratio(base: float | None, ms: float) -> float | None:
    return None if base is None else base / ms


def fidelity_grouping(method_name: str) -> tuple[int, int]:
    """(clusters, iterations) of the V-Smooth grouping a method's rel-L2 is measured with: the preset a
    user picks for that kernel mode (vc-fidelity: the fidelity preset; vc-speed: balanced, the default
    preset that runs ExpCast; plain 8-bit and peers: kernels/grouping.py's defaults, which peers ignore)."""
    from ..kernels import grouping
    from ..nodes.presets import PRESETS

    preset = _preset_of(method_name)
    if preset is None:
        return grouping.DEFAULT_CLUSTERS, grouping.DEFAULT_ITERS
    return PRESETS[preset]["clusters"], PRESETS[preset]["kmeans_iters"]


def _preset_of(method_name: str):
    """The preset whose grouping a method's rel-L2 is measured with, or None (kernels/grouping.py's defaults)."""
    return {"vc-fidelity": "fidelity", "vc-speed": "balanced"}.get(method_name)


def fidelity_within_bins(method_name: str) -> int:
    """The within-cluster bins of the grouping a method's rel-L2 is measured with: those of the preset
    fidelity_grouping names (nodes/presets.WITHIN_BINS), else kernels/grouping.py's default."""
    from ..kernels import grouping
    from ..nodes.presets import within_bins

    preset = _preset_of(method_name)
    return grouping.DEFAULT_WITHIN_BINS if preset is None else within_bins(preset)


def _fidelity(methods, head_dim: int) -> dict[str, float]:
    """rel-L2 per method name (ours keyed 'name[backend]') on video-like data against float64."""
    import torch

    from ..kernels import grouping
    from ..study.videodata import video_like_qkv

    q, k, v = video_like_qkv(B=1, H=FIDELITY_HEADS, T=FIDELITY_GRID[0], Hgrid=FIDELITY_GRID[1],
                             Wgrid=FIDELITY_GRID[2], D=head_dim, dtype=torch.bfloat16, device="cuda")
    perms = {}  # one grouping per (clusters, iterations, within-cluster bins) that some method uses
    for m in methods:
        g = (*fidelity_grouping(m.name), fidelity_within_bins(m.name))
        if g not in perms:
            perms[g] = grouping.group_tokens(v, g[0], g[1], within_bins=g[2]).perm()
    rows = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(0))[:FIDELITY_ROWS].to("cuda")
    qd, kd, vd = q[:, :, rows].double(), k.double(), v.double()
    exact = torch.softmax(qd @ kd.transpose(-1, -2) / head_dim ** 0.5, dim=-1) @ vd
    out = {}
    for m in methods:
        got = m.fn(q, k, v, perms[(*fidelity_grouping(m.name), fidelity_within_bins(m.name))])[:, :, rows].double()
        out[_key(m)] = float((got - exact).norm() / exact.norm())
    return out


def grouping_label(clusters: int, iters: int, bins: int) -> str:
    """'C x I' of a grouping, with ', B bins' where it takes within-cluster bins (the bench tables' form)."""
    return f"{clusters} x {iters}" + (f", {bins} bins" if bins >= 2 else "")


def _grouping_label(method_name: str) -> str:
    """grouping_label of a method's rel-L2 grouping."""
    return grouping_label(*fidelity_grouping(method_name), fidelity_within_bins(method_name))


def _key(method) -> str:
    return method.name if method.backend is None else f"{method.name}[{method.backend}]"


def attention_rows(shapes: dict, backend: str, reps: int, portable_shapes: set[str], fidelity: bool,
                   log=print) -> tuple[list[dict], list[dict]]:
    """(attention rows, grouping rows) for `shapes` {name: (B, H, N, D)}."""
    import torch

    from ..kernels import backends, grouping
    from ..kernels.config import SPEED
    from ..nodes.presets import PRESETS
    from .bench import cuda_time_ms
    from .bench_peers import CUDNN, SAGE, SAGE_PORTABLE, peer_methods, vc_methods

    # the grouping a speed-mode run computes (its share of the speed-mode call is reported)
    clusters, iters = PRESETS["speed"]["clusters"], PRESETS["speed"]["kmeans_iters"]
    attention, groupings, errors = [], [], {}
    for name, (b, h, n, d) in shapes.items():
        flops = 4.0 * b * h * n * n * d
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        chosen = backends.select(q, SPEED, "bhnd", backend, allow_slow=False).name
        portable = name in portable_shapes
        methods = [m for m in peer_methods() if portable or not m.portable] + vc_methods(chosen, portable)

        def group():
            return grouping.group_tokens(v, clusters, iters).perm()

        group_ms = cuda_time_ms(group, reps, min_total_ms=SHORT_CALL_TOTAL_MS)
        perm = group()
        times = {}
        for m in methods:
            times[_key(m)] = cuda_time_ms(lambda: m.fn(q, k, v, perm), reps, min_total_ms=SHORT_CALL_TOTAL_MS)
            log(f"[bench] {name} {_key(m)}: {times[_key(m)]:.2f} ms")
        missing = [m for m in methods if _key(m) not in errors.get(d, {})]
        if fidelity and missing:  # per head dim, each method once (portable rows join at their first shape)
            errors.setdefault(d, {}).update(_fidelity(missing, d))
        for m in methods:
            ms = times[_key(m)]
            attention.append(dict(
                shape=name, B=b, H=h, N=n, D=d, method=m.name, backend=m.backend, portable=m.portable, ms=ms,
                tops_eq=flops / ms / 1e9, fp8_peak_fraction=flops / ms / 1e9 / FP8_DENSE_PEAK_TOPS,
                x_cudnn=_ratio(times.get(CUDNN), ms), x_sageattn=_ratio(times.get(SAGE), ms),
                x_sageattn_portable=_ratio(times.get(SAGE_PORTABLE), ms),
                rel_l2_video_like=errors.get(d, {}).get(_key(m)),
                # the V-Smooth grouping of that rel-L2 (our rows; peers take no permutation)
                rel_l2_grouping=None if m.backend is None else _grouping_label(m.name),
            ))
        speed_ms = times[f"vc-speed[{chosen}]"]
        groupings.append(dict(shape=name, B=b, H=h, N=n, D=d, clusters=clusters, iters=iters, ms=group_ms,
                              speed_call_ms=speed_ms, share_of_speed_call=group_ms / speed_ms, backend=chosen))
        del q, k, v, perm
        torch.cuda.empty_cache()
    return attention, groupings
