"""GPU tier of every CUDA backend (one suite, parametrized over the backends that declare each case).

Each backend runs against reference.py: the same quantization on both sides, so the gate is tight
(relative L2 against the float64 emulation <= 1e-3 above the output dtype's own rounding). Outputs
are poisoned with NaN first. Random AND video-like data, odd N, head dims 64/128, fp16/bf16, both
layouts, with permutations. The public-op tests patch the reference emulation to raise and read
BACKEND_CALLS, so a silent fallback fails. A backend this GPU cannot run (arch, toolchain) skips
with its reason; a case a backend does not declare is not generated.

  pytest -q -m gpu
"""
import math

import pytest
import torch

from vc_attention.kernels import api, backend_sm90, backends, reference
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.layout import from_bhnd, shape_in, to_bhnd
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.kernels.prepare_reference import prepare_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CONFIGS = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT, "fp8qk": VCConfig(qk="fp8"),
           "fp8qk_speed": VCConfig(qk="fp8", p="expcast")}
CUDA_BACKENDS = [b.name for b in backends.backends() if b.constraints.device_type == "cuda"]
GATE = 1e-3


def _declares(name: str, config: VCConfig, d: int, dtype: torch.dtype, layout: str) -> bool:
    """Whether the backend's declaration covers the case (what a tensor-free check can say): config itself or, as the op
    runs it (backends.runnable_config), config less the refinements the backend lacks (the fidelity preset's second V
    term and mixed encoding on the portable kernel or at head dim 64)."""
    c = backends.get(name).constraints
    return any((c.dtypes is None or dtype in c.dtypes) and (c.head_dims is None or d in c.head_dims)
               and cand.qk in c.qk_formats and cand.v in c.v_formats and cand.p in c.p_encodings and layout in c.layouts
               for cand in config.refinements_dropped())


def _runs(name: str, q, config: VCConfig, layout: str) -> VCConfig:
    """The configuration backend `name` runs for this call (the op's backends.runnable_config): the case's, less the
    refinements it cannot take here."""
    runnable = backends.runnable_config(backends.get(name), q, config, layout)
    if runnable is None:
        pytest.fail(f"{name} declares the case but runs none of {config.tag}'s configurations: "
                    f"{backends.get(name).why_not(q, config, layout)}")
    return runnable


def _cases(configs, ns, layouts, dims):
    return [pytest.param(b, cfg, n, layout, d, dtype, id=f"{b}-{cfg}-N{n}-{layout}-D{d}-{str(dtype)[6:]}")
            for b in CUDA_BACKENDS for cfg in configs for n in ns for layout in layouts for d, dtype in dims
            if _declares(b, CONFIGS[cfg], d, dtype, layout)]


def _backend(name: str) -> backends.Backend:
    backend = backends.get(name)
    if backend.availability():
        pytest.skip(f"{name}: {backend.availability()}")
    return backend


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _random_qkv(b, h, n, d, dtype, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(shape_in(layout, b, h, n, d), generator=gen, device="cuda") for _ in range(3))
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")  # channel offsets: what V-Smooth removes
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _perm(q, layout, config):
    b, h, n, _ = to_bhnd(q, layout).shape
    return torch.argsort(torch.rand(b, h, n, device="cuda"), dim=-1) if config.v == "vsmooth" else None


def _emulation(name, q, k, v, perm, config, layout):
    """The float64 emulation (B,H,N,D) of backend `name` (its online-softmax step), on contiguous copies
    (block_absmax views its input)."""
    config = _runs(name, q, config, layout)
    qb, kb, vb = (to_bhnd(t, layout).contiguous() for t in (q, k, v))
    step = backends.get(name).softmax_step(qb.shape[-1], config)
    return reference.vc_attention_reference(qb, kb, vb, config, perm=perm, parts=True, offset_block=step).out


def _poisoned_run(name, q, k, v, perm, config, layout):
    """The backend's attention over the CUDA prepare's operands, into an output full of NaN."""
    backend = _backend(name)
    config = _runs(name, q, config, layout)
    ops = prepare_cuda(q, k, v, perm, config, layout)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    return backend.attend(ops, config, out, layout)


def _check(out, ref64, layout):
    """Finite, and within the gate above the output dtype's rounding of the emulation."""
    out = to_bhnd(out, layout)
    assert torch.isfinite(out).all()
    floor = _rel_l2(ref64.to(out.dtype), ref64)
    err = _rel_l2(out, ref64)
    assert err <= floor + GATE, f"rel-L2 {err:.2e} vs the emulation (dtype floor {floor:.2e})"


@pytest.fixture
def no_emulation(monkeypatch):
    """Inside a fast-path call the reference emulation raises: a silent fallback fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the reference emulation ran inside a fast-path call")

    def patch():
        monkeypatch.setattr(reference, "vc_attention_reference", refuse)

    return patch


@pytest.mark.parametrize("name,cfg,n,layout,d,dtype", _cases(CONFIGS, [1, 77, 128, 129, 4097], ["bhnd", "bnhd"],
                                                               [(64, torch.float16), (64, torch.bfloat16),
                                                                (128, torch.bfloat16), (128, torch.float16)]))
def test_random_data_matches_the_emulation(name, cfg, n, layout, d, dtype):
    config = CONFIGS[cfg]
    q, k, v = _random_qkv(2, 2, n, d, dtype, layout, seed=n + d)
    perm = _perm(q, layout, config)
    out = _poisoned_run(name, q, k, v, perm, config, layout)
    ref64 = _emulation(name, q, k, v, perm, config, layout)
    _check(out, ref64, layout)
    # and the total error stays that of the emulation (fp64 exact attention, chunked)
    qb, kb, vb = (to_bhnd(t, layout).double() for t in (q, k, v))
    scale = 1.0 / math.sqrt(d)
    exact = torch.cat([torch.softmax(qb[:, :, i:i + 2048] @ kb.transpose(-1, -2) * scale, -1) @ vb
                       for i in range(0, n, 2048)], dim=2)
    assert _rel_l2(to_bhnd(out, layout), exact) <= 1.5 * _rel_l2(ref64, exact) + 1e-3


@pytest.mark.parametrize("name,cfg,n,layout,d,dtype", _cases(CONFIGS, [6240], ["bhnd", "bnhd"],
                                                               [(128, torch.bfloat16), (64, torch.float16)]))
def test_video_like_data_with_grouping_matches_the_emulation(name, cfg, n, layout, d, dtype):
    from vc_attention.study.fidelity import grouping_permutation
    from vc_attention.study.videodata import video_like_qkv

    config = CONFIGS[cfg]
    q, k, v = video_like_qkv(B=2, H=2, T=4, Hgrid=30, Wgrid=52, D=d, dtype=dtype, device="cuda")  # N = 6240
    perm = grouping_permutation(v, 64, 8) if config.v == "vsmooth" else None
    q, k, v = (from_bhnd(t, layout).contiguous() for t in (q, k, v))
    out = _poisoned_run(name, q, k, v, perm, config, layout)
    _check(out, _emulation(name, q, k, v, perm, config, layout), layout)


def _rising_max_qkv(d, dtype, device, n=640, rise=0.37):
    """One dominant key per 128-key tile whose score rises by `rise` (log2 units, not an integer) from
    tile to tile over a flat background, for every query row: the running max moves by a fraction at
    each tile, and the early tiles' codes are rescaled by non-power-of-two alphas."""
    gen = torch.Generator().manual_seed(11)
    direction = torch.nn.functional.normalize(torch.randn(d, generator=gen), dim=0)
    q = 4.0 * direction + 0.05 * torch.randn(1, 2, n, d, generator=gen)
    k = 0.3 * torch.randn(1, 2, n, d, generator=gen)
    per_unit = 4.0 / math.sqrt(d) * reference.LOG2E  # log2-unit score of a key c * direction, per c
    for tile in range(n // reference.K_BLOCK):
        k[:, :, tile * reference.K_BLOCK + 17] = (9.0 + rise * tile) / per_unit * direction
    v = torch.randn(1, 2, n, d, generator=gen)  # no common offset: the weights of the dominant keys show
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def _integer_offset_emulation(name, q, k, v, config, monkeypatch):
    """The previous spec (running offset M = ceil of the running max), for contrast."""
    exact_max = reference.running_row_offsets
    with monkeypatch.context() as m:
        m.setattr(reference, "running_row_offsets", lambda s, block=reference.K_BLOCK: torch.ceil(exact_max(s, block)))
        return _emulation(name, q, k, v, None, config, "bhnd")


def _rising_max_cases():
    """The sm90 kernel's exp2 modes miss the gate on this data in fp16 (measured on the H200, 2026-12-01:
    rel-L2 1.86e-3 at head dim 64 and 1.88e-3 at 128 against a 1.2e-3 gate; the mma kernel sits at the
    dtype floor, and the same sm90 kernels pass every other case). The rows hold one key 512x above a
    flat background. Not explained yet: a model of the FP8 wgmma accumulator (13-bit truncating adds per
    k-step) gives only 1.4e-4 on this data. Marked, strictly, until it is resolved (kernel-notes 12)."""
    cases = []
    for case in _cases(["speed", "fidelity", "plain8"], [640], ["bhnd"], [(128, torch.bfloat16), (64, torch.float16)]):
        name, cfg, _, _, _, dtype = case.values
        # (float16 is the head dim 64 case: there sm90 runs fidelity's mixed encoding on its ExpCast kernel and drops
        # the second term; the exp2 kernel runs plain 8-bit)
        runs = CONFIGS[cfg].with_(v_lo_channels=0)
        exp2_kernel = not backend_sm90.kernel_expcast(64, runs) and runs.without_refinements().p == "exp2"
        if name == "sm90" and exp2_kernel and dtype == torch.float16:
            case = pytest.param(*case.values, id=case.id, marks=pytest.mark.xfail(
                strict=True, reason="sm90 exp2 P on one-dominant-key rows: 1.9e-3 over the emulation, cause open (kernel-notes 12)"))
        cases.append(case)
    return cases


@pytest.mark.parametrize("name,cfg,n,layout,d,dtype", _rising_max_cases())
def test_a_running_max_that_rises_by_a_fraction_matches_the_emulation(name, cfg, n, layout, d, dtype, monkeypatch):
    """The kernels hold the exact running max (no ceil) and rescale by 2^(M_old - M_new) for any
    fraction: they match the spec, and not the integer-offset spec they replaced (which differs by far
    more than the gate on this data, so the test can tell the two apart)."""
    config = CONFIGS[cfg]
    q, k, v = _rising_max_qkv(d, dtype, "cuda", n)
    out = _poisoned_run(name, q, k, v, None, config, layout)
    ref64 = _emulation(name, q, k, v, None, config, layout)
    _check(out, ref64, layout)
    old = _integer_offset_emulation(name, q, k, v, config, monkeypatch)
    floor = _rel_l2(ref64.to(out.dtype), ref64)
    assert _rel_l2(old, ref64) > 5 * (floor + GATE)
    assert _rel_l2(out, old) > floor + GATE


@pytest.mark.parametrize("name,cfg,n,layout,d,dtype", _cases(["speed"], [1000], ["bhnd"], [(128, torch.bfloat16), (64, torch.float16)]))
def test_speed_encoding_on_tiles_wider_than_its_clamp_free_range(name, cfg, n, layout, d, dtype):
    """The integer ExpCast form clamps a score more than ~77 log2 units under its tile's max (what keeps
    the 32-bit fixed point from wrapping); the sm90 kernel skips the clamp for warps whose scores are all
    in range. Q scaled up until many tiles span more than 120 log2 units: both paths run, and the
    clamped scores must come out as code 0 exactly as the spec's (t <= 0) do."""
    config = CONFIGS[cfg]
    q, k, v = _random_qkv(1, 2, n, d, dtype, layout, seed=5)
    q = (q.float() * 20.0).to(dtype)
    qb, kb = to_bhnd(q, layout).float(), to_bhnd(k, layout).float()
    s = (qb @ kb.transpose(-1, -2)) * reference.qk_scale(d, None)
    tiles = torch.nn.functional.pad(s, (0, -n % reference.K_BLOCK), value=float("nan")).unflatten(-1, (-1, reference.K_BLOCK))
    spread = tiles.nan_to_num(float("-inf")).amax(-1) - tiles.nan_to_num(float("inf")).amin(-1)
    assert (spread > 120).float().mean() > 0.2  # the clamped scores exist (most warps take the clamping path)
    _check(_poisoned_run(name, q, k, v, None, config, layout), _emulation(name, q, k, v, None, config, layout), layout)


@pytest.mark.parametrize("name,cfg,n,layout,d,dtype", _cases(["speed", "fidelity"], [75600], ["bnhd"], [(128, torch.bfloat16)]))
def test_wan_length_sequence(name, cfg, n, layout, d, dtype):
    config = CONFIGS[cfg]
    q, k, v = _random_qkv(1, 2, n, d, dtype, layout, seed=1)
    perm = _perm(q, layout, config)
    _check(_poisoned_run(name, q, k, v, perm, config, layout), _emulation(name, q, k, v, perm, config, layout), layout)


def _error_vs_exact(name, config, n, rows=256, seed=3):
    """rel-L2 against float64 exact attention on `rows` sampled query rows, one head of length n."""
    q, k, v = _random_qkv(1, 1, n, 128, torch.bfloat16, "bhnd", seed=seed)
    out = _poisoned_run(name, q, k, v, _perm(q, "bhnd", config), config, "bhnd")
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:rows].to("cuda")
    qd, kd, vd = q[:, :, idx].double(), k.double(), v.double()
    exact = torch.softmax(qd @ kd.transpose(-1, -2) / 128 ** 0.5, dim=-1) @ vd
    return float((out[:, :, idx].double() - exact).norm() / exact.norm())


@pytest.mark.parametrize("name,cfg", [(b, c) for b in CUDA_BACKENDS for c in ("speed", "fidelity")])
def test_long_sequences_stay_as_accurate_as_short_ones(name, cfg):
    """Past 160K tokens some 8-bit kernels turn to noise (score or row-sum range, 32-bit offsets):
    the error at N = 163,840 must stay within 1.5x of the same kernel's at N = 16,384."""
    config = CONFIGS[cfg]
    short, long = _error_vs_exact(name, config, 16384), _error_vs_exact(name, config, 163840)
    assert math.isfinite(long) and long <= 1.5 * short, (short, long)


@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_64bit_offsets(name):
    """B*H*N*D > 2^31 elements: the last head must still be right."""
    b, h, n, d = 1, 104, 163840, 128
    assert b * h * n * d > 2**31
    q, k, v = _random_qkv(b, h, n, d, torch.bfloat16, "bnhd", seed=2)
    out = _poisoned_run(name, q, k, v, None, PLAIN_8BIT, "bnhd")
    last = slice(h - 1, h)
    _check(out[:, :, last], _emulation(name, q[:, :, last], k[:, :, last], v[:, :, last], None, PLAIN_8BIT, "bnhd"), "bnhd")


@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_a_wrong_result_fails_the_gate(name):
    q, k, v = _random_qkv(1, 2, 500, 128, torch.float16, "bhnd", seed=3)
    out = _poisoned_run(name, q, k, v, None, FIDELITY, "bhnd")
    with pytest.raises(AssertionError):
        _check(out, _emulation(name, q, k, v, None, FIDELITY, "bhnd") * 1.01, "bhnd")


@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_public_op_runs_the_named_backend(name, no_emulation):
    q, k, v = _random_qkv(2, 3, 300, 128, torch.bfloat16, "bnhd", seed=7)
    perm = _perm(q, "bnhd", SPEED)
    ref64 = _emulation(name, q, k, v, perm, SPEED, "bnhd")
    _backend(name)
    no_emulation()
    before = api.BACKEND_CALLS.copy()
    out = api.vc_attention(q, k, v, layout="bnhd", config=SPEED, perm=perm, backend=name)
    assert api.BACKEND_CALLS - before == {name: 1}
    _check(out, ref64, "bnhd")


def test_auto_runs_the_fastest_available_backend(no_emulation):
    q, k, v = _random_qkv(1, 2, 256, 128, torch.bfloat16, "bhnd", seed=8)
    available = [b for b in backends.backends() if b.constraints.device_type == "cuda" and not b.why_not(q, SPEED, "bhnd", k, v)]
    if not available:
        pytest.skip("no CUDA backend runs on this GPU: " + "; ".join(f"{n}: {r}" for n, r in backends.describe(q, SPEED)))
    ref64 = _emulation(available[0].name, q, k, v, None, SPEED, "bhnd")
    no_emulation()
    before = api.BACKEND_CALLS.copy()
    out = api.vc_attention(q, k, v, config=SPEED)
    assert api.BACKEND_CALLS - before == {available[0].name: 1}
    _check(out, ref64, "bhnd")


@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_an_undeclared_case_is_declined_with_its_reason(name):
    backend = _backend(name)
    q = torch.zeros(1, 2, 64, 128, device="cuda", dtype=torch.bfloat16)
    for what, config, qq in (("dtype float32", FIDELITY, q.float()), ("head dim 96", FIDELITY, q[..., :96].contiguous()),
                             ("QK format 'fp8'", FIDELITY.with_(qk="fp8"), q)):
        if not _declares(name, config, qq.shape[-1], qq.dtype, "bhnd"):
            assert what in backend.why_not(qq, config, "bhnd")
    with pytest.raises(backends.NoCapableBackend, match="16-byte aligned"):
        api.vc_attention(q, q, q.transpose(-1, -2).contiguous().transpose(-1, -2), backend=name)


@pytest.mark.parametrize("cfg,n", [("fidelity", 1000), ("plain8", 1000), ("fp8qk", 1000), ("speed", 1000), ("speed", 1100),
                                   ("speed-per-step", 1000), ("speed-per-step", 1100)])
def test_cuda_prepare_matches_the_contract(cfg, n):
    """speed has V-Smooth means per 256 rows (v_mean_rows) merged into segments (v_mean_merge; random V: one
    segment per head), speed-per-step the unmerged 256-row means, stored once per 128 rows; N = 1100 ends on
    a lone 128-row block (9 of them), whose mean covers only its own rows."""
    config = SPEED.with_(v_mean_merge=False) if cfg == "speed-per-step" else CONFIGS[cfg]
    q, k, v = _random_qkv(2, 3, n, 128, torch.bfloat16, "bnhd", seed=3)
    perm = torch.argsort(torch.rand(2, 3, n, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, config, "bnhd")
    want = prepare_reference(q, k, v, perm, config, "bnhd")
    assert torch.equal(got.q_q.view(torch.uint8), want.q_q.view(torch.uint8))
    # scales: amax / 127 is a true division in the kernel and on the CPU reference, while torch on
    # CUDA multiplies by the rounded reciprocal: one ulp apart at most
    assert got.q_scale.shape == (2, 3, -(-n // 128) * 128)  # one scale per query row, padded rows 0
    torch.testing.assert_close(got.q_scale, want.q_scale, rtol=2.5e-7, atol=0)
    # K mean and V block means are float32 sums in another order: allow rare one-code differences
    for field in ("k_q", "v_t"):
        same = (getattr(got, field).view(torch.uint8) == getattr(want, field).view(torch.uint8)).float().mean()
        assert same > 0.999
    torch.testing.assert_close(got.k_scale, want.k_scale, rtol=1e-6, atol=0)
    # segments: the amax bound adds |block mean - segment mean|, whose fp16 segment mean may round apart
    torch.testing.assert_close(got.v_scale, want.v_scale, rtol=1e-3 if config.v_mean_merge else 1e-6, atol=0)
    torch.testing.assert_close(got.v_mean.float(), want.v_mean.float(), rtol=1e-3, atol=1e-3)
    if config.v_mean_merge:  # one distribution: the whole head is one segment, its flag on the last slot
        assert torch.equal(got.v_seg_end, want.v_seg_end) and got.v_seg_end.sum(-1).eq(1).all()
    elif config.v_mean_rows == 256:  # the pairs' two slots hold one mean, bit for bit
        pairs = got.v_mean.shape[2] // 2
        assert torch.equal(got.v_mean[:, :, 0:2 * pairs:2], got.v_mean[:, :, 1:2 * pairs:2])
        assert not torch.equal(got.v_mean[:, :, 0:2 * pairs - 2:2], got.v_mean[:, :, 2:2 * pairs:2])


def test_mma_log_sum_exp_output():
    from vc_attention.kernels import backend_mma

    _backend("mma")
    q, k, v = _random_qkv(1, 2, 300, 64, torch.float16, "bhnd", seed=0)
    config = PLAIN_8BIT.with_(smooth_k=False)  # K smoothing shifts the LSE (see attention_from_operands)
    ops = prepare_cuda(q, k, v, None, config)
    lse = torch.full((1, 2, 300), float("nan"), device="cuda")
    backend_mma.attention_from_operands(ops, config, torch.empty_like(q), "bhnd", lse=lse)
    exact = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) / 8.0, dim=-1)
    assert (lse.double() - exact).abs().max() < 0.05


class _TinyBlock(torch.nn.Module):
    """A projection, the op, a projection: the smallest model that calls vc_attention."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, n, dim = x.shape
        q, k, v = (t.view(b, n, self.heads, dim // self.heads) for t in self.qkv(x).chunk(3, dim=-1))
        # smooth_k off: the K-mean's atomic float sums would make even two eager runs differ in bits
        o = api.vc_attention(q.contiguous(), k.contiguous(), v.contiguous(), layout="bnhd",
                             config=PLAIN_8BIT.with_(smooth_k=False))
        return self.out(o.reshape(b, n, dim))


def test_torch_compile_fullgraph_equals_eager(no_emulation):
    torch.manual_seed(0)
    model = _TinyBlock(256, 2).to("cuda", torch.bfloat16)
    x = torch.randn(1, 333, 256, device="cuda", dtype=torch.bfloat16)
    if all(backends.get(name).availability() for name in CUDA_BACKENDS):
        pytest.skip("no CUDA backend runs on this GPU")
    no_emulation()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        eager = model(x)
        assert torch.equal(model(x), eager)  # deterministic, so "equal" below is a fair demand
        before = api.BACKEND_CALLS.copy()
        got = compiled(x)
    assert sum((api.BACKEND_CALLS - before).values()) == 1 and "reference" not in api.BACKEND_CALLS - before
    assert torch.equal(got, eager)


@pytest.mark.parametrize("portable", [False, True])
def test_bench_runs_every_method(portable):
    """The benchmark's attention section: every peer and our three configurations, timed and with
    their fidelity, on the backend auto picks (and on mma beside it when the portable rows are asked)."""
    from vc_attention.commands import bench_attention

    _backend("mma")
    before = api.BACKEND_CALLS.copy()
    rows, groupings = bench_attention.attention_rows({"small": (1, 2, 1024, 128)}, "auto", 1,
                                                     {"small"} if portable else set(), True, log=lambda *_: None)
    ran = {(r["method"], r["backend"]) for r in rows}
    assert {("sdpa-cudnn", None), ("sdpa-flash", None)} <= ran
    ours = [r for r in rows if r["method"].startswith("vc-")]
    assert {r["method"] for r in ours} == {"vc-plain8", "vc-fidelity", "vc-speed"}
    assert ("vc-speed", "mma") in ran if portable else all(not r["portable"] for r in ours)
    assert all(r["ms"] > 0 and 0 < r["rel_l2_video_like"] < 0.05 for r in ours)
    assert "reference" not in api.BACKEND_CALLS - before
    assert groupings[0]["share_of_speed_call"] > 0


@pytest.mark.parametrize("cfg,d", [("speed", 128), ("fidelity", 128), ("plain8", 128), ("fidelity", 64), ("speed", 64)])
def test_sm90_runs_each_case_on_the_cta_shape_its_split_names(cfg, d):
    """The Hopper library links a two- and a three-consumer build (backend_sm90.SOURCES): the kernel that
    runs (read from the profiler's kernel names) is the one `consumers()` names, three warpgroups
    everywhere but head dim 128 with V-Smooth (the fidelity and speed modes), and it matches the emulation
    of its online-softmax step (256 keys for those cases: the 256-key loops; `step_keys()` and the
    backend's Python rule agree). What ties the step is `step_keys()`, the compiled library's own rule:
    on this random data the 128- and 256-key emulations differ by only ~3e-4 rel-L2, inside the gate,
    so the output check alone would not tell the two steps apart."""

    backend = _backend("sm90")
    q, k, v = _random_qkv(1, 2, 1000, d, torch.bfloat16, "bhnd", seed=9)
    config = _runs("sm90", q, CONFIGS[cfg], "bhnd")
    perm = _perm(q, "bhnd", config)
    ops = prepare_cuda(q, k, v, perm, config, "bhnd")
    expected = backend_sm90.extension().consumers(d, config.p == "expcast", config.v == "vsmooth")
    two_consumers = d == 128 and cfg in ("fidelity", "speed")
    assert expected == (2 if two_consumers else 3)
    step = backend_sm90.extension().step_keys(d, config.p == "expcast", config.v == "vsmooth")
    assert step == backend.softmax_step(d, config) == (256 if two_consumers else 128)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        backend.attend(ops, config, out, "bhnd")
        torch.cuda.synchronize()
    ran = {e.name for e in prof.events() if "vc_attention_sm90_kernel" in e.name}
    assert ran and all(f"consumers{expected}" in name for name in ran), ran
    _check(out, _emulation("sm90", q, k, v, perm, config, "bhnd"), "bhnd")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sm90_speed_restores_one_mean_per_step_when_the_means_come_in_pairs(dtype, sm90_kernel_flags):
    """Speed mode's means cover 256 rows (VCConfig.v_mean_rows), so its 256-key loop restores one mean per
    step: the STEPMEAN kernel (the profiler's kernel name: its last template argument) runs for them and
    the two-mean kernel for 128-row means; both match their emulation, and their outputs differ in bits
    ((l_a + l_b) mu vs l_a mu + l_b mu: another rounding), so the fast fold is what ran."""

    backend = _backend("sm90")
    assert backend_sm90.extension().step_mean(128, True) == 1 and backend_sm90.extension().step_mean(64, True) == 0
    q, k, v = _random_qkv(1, 2, 1100, 128, dtype, "bhnd", seed=11)
    perm = _perm(q, "bhnd", SPEED)
    outs = {}
    for rows in (256, 128):
        config = SPEED.with_(k_lane_scales=False, v_mean_merge=False, v_mean_rows=rows, k_scale_rows=rows)
        ops = prepare_cuda(q, k, v, perm, config, "bhnd")
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            backend.attend(ops, config, out, "bhnd")
            torch.cuda.synchronize()
        ran = [e.name for e in prof.events() if "vc_attention_sm90_kernel" in e.name]
        assert ran and all(sm90_kernel_flags(name)[:2] == (False, rows == 256) for name in ran), ran
        _check(out, _emulation("sm90", q, k, v, perm, config, "bhnd"), "bhnd")
        outs[rows] = out
    # the 128-row run used its own means: compare the one-mean fold with the two-mean fold on the SAME operands
    config = SPEED.with_(k_lane_scales=False, v_mean_merge=False)
    ops = prepare_cuda(q, k, v, perm, config, "bhnd")
    two = torch.empty_like(q)
    backend_sm90.extension().attention(ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean,
                                       None, None, None, two, ops.n_tokens, True, 1, torch.cuda.current_stream().cuda_stream)
    assert not torch.equal(two, outs[256])
    assert _rel_l2(two, outs[256]) < 1e-3


@pytest.mark.parametrize("cfg", ["fidelity", "speed", "plain8"])
@pytest.mark.parametrize("layout,d,dtype", [("bhnd", 128, torch.bfloat16), ("bnhd", 64, torch.float16),
                                            ("bnhd", 128, torch.float16)])
def test_sm90_one_call_equals_prepare_then_attend(cfg, layout, d, dtype, monkeypatch):
    """sm90's run is prepare_attend (the prepare extension calls the library's C entry: one binding call); it
    writes exactly what the operand path (prepare_cuda, then attend) writes. The operand path is patched to
    raise inside the one-call run, so a run that fell back to it fails."""
    from vc_attention.kernels import prepare_cuda as prep

    backend = _backend("sm90")
    q, k, v = _random_qkv(2, 3, 1100, d, dtype, layout, seed=d)
    config = _runs("sm90", q, CONFIGS[cfg], layout)
    perm = _perm(q, layout, config)
    want = _poisoned_run("sm90", q, k, v, perm, config, layout)

    def refuse(*args, **kwargs):
        raise AssertionError("the operand path ran inside the one-call run")

    with monkeypatch.context() as patched:
        patched.setattr(prep, "prepare_cuda", refuse)
        patched.setattr(backend_sm90, "attention_from_operands", refuse)
        got = backend.run(q, k, v, perm, config, layout, None)
    assert backend.run is backend_sm90.run_one_call
    assert got.shape == q.shape and got.stride() == q.stride()
    assert torch.equal(got, want)


def test_sm90_one_call_with_the_low_rank_term():
    """The one-call path passes the low-rank operands (v_low_t, the basis, its scales) to the entry as the
    attention binding did."""

    backend = _backend("sm90")
    config = FIDELITY.without_refinements().with_rank(3)  # (the low-rank kernel takes neither refinement)
    q, k, v = _random_qkv(1, 2, 700, 128, torch.bfloat16, "bhnd", seed=7)
    perm = _perm(q, "bhnd", config)
    basis = reference.lowrank_basis(reference.permute_tokens(v, perm.long()), 3)
    ops = prepare_cuda(q, k, v, perm, config, "bhnd", basis=basis)
    want = backend.attend(ops, config, torch.empty_like(q), "bhnd")
    got = backend_sm90.run_one_call(q, k, v, perm, config, "bhnd", None, basis)
    assert torch.equal(got, want)
