"""CPU tests of the numerics spec (kernels/reference.py): invariants, exact codes, tails, layouts."""
import math

import pytest
import torch

from vc_attention.kernels import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels import reference as R


def rand_qkv(b, h, n, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g).to(dtype) for _ in range(3)]


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ---------------------------------------------------------------- permutation invariance
def test_permuting_k_and_v_together_leaves_attention_unchanged():
    q, k, v = rand_qkv(2, 3, 200, 64, torch.float64)
    perm = torch.stack([torch.randperm(200) for _ in range(6)]).view(2, 3, 200)
    out = R.exact_attention(q, k, v)
    out_p = R.exact_attention(q, R.permute_tokens(k, perm), R.permute_tokens(v, perm))
    assert torch.allclose(out, out_p, rtol=0, atol=1e-12)
    # permuting only V must change the result: the test can fail
    assert not torch.allclose(out, R.exact_attention(q, k, R.permute_tokens(v, perm)), atol=1e-3)


def test_labels_to_permutation_is_stable_sort_and_a_permutation():
    labels = torch.tensor([[[2, 0, 1, 0, 2, 1, 0]]])
    perm = R.labels_to_permutation(labels)
    assert perm.tolist() == [[[1, 3, 6, 2, 5, 0, 4]]]
    assert sorted(perm.flatten().tolist()) == list(range(7))


# ---------------------------------------------------------------- ExpCast codes
def test_every_paper_expcast_code_decodes_to_its_e4m3_value():
    codes = torch.arange(0, R.EXPCAST_MAX_CODE + 1)
    torch_vals = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
    assert torch.equal(R.decode_e4m3(codes), torch_vals)
    u = (codes.float() - 119.65) / 8  # the u whose code is exactly `codes`
    assert torch.equal(R.expcast_paper_code(u), codes.to(torch.int32))
    assert torch.equal(R.p_expcast_paper(u), torch_vals)


def test_paper_expcast_anchor_codes():
    codes = R.expcast_paper_code(torch.tensor([0.0, -8.0, -14.0, 5.0, -40.0]))
    assert codes.tolist() == [120, 56, 8, 120, 0]
    assert R.decode_e4m3(codes[:3]).tolist() == [256.0, 1.0, 2.0**-6]


def test_paper_expcast_is_monotone_in_u():
    u = torch.linspace(-20, 0, 20001)
    codes = R.expcast_paper_code(u)
    assert bool((codes[1:] >= codes[:-1]).all())


def test_beta_is_the_minmax_centre_of_eps():
    m = torch.linspace(0, 8, 800001, dtype=torch.float64)
    eps = m - 8 * torch.log2(1 + m / 8)
    centre = 0.5 * (eps.max() + eps.min()).item()
    assert centre == pytest.approx(-0.3443, abs=1e-4)
    assert abs(R.EXPCAST_BETA - centre) < 0.01


@pytest.mark.parametrize("config,top", [(PLAIN_8BIT, 256.0), (SPEED, 448.0), (FIDELITY, 448.0)], ids=["exp2", "expcast", "mixed"])
def test_the_row_max_encodes_to_the_top_code_exactly(config, top):
    """The running offset is the exact max, so each row's largest score is the top code whatever
    its value (an integer offset M = ceil(max) put it anywhere in (top/2, top])."""
    s = torch.randn(64, 1000, generator=torch.Generator().manual_seed(3)) * 7 + 0.37
    p = R.quantize_p(s, config)
    assert torch.equal(p.amax(-1), torch.full((64,), top, dtype=torch.float64))
    assert torch.equal(p.argmax(-1), s.argmax(-1))


def test_the_running_offset_is_the_exact_running_max():
    s = torch.tensor([[0.3, -1.0, 2.7, 1.0, 2.5, 9.1]])
    assert R.running_row_offsets(s, block=2).tolist() == [[pytest.approx(0.3), pytest.approx(2.7), pytest.approx(9.1)]]
    assert torch.equal(R.running_row_offsets(s, block=2)[..., -1:], R.row_offset(s))


def test_exp2_adds_the_float32_row_constant_as_the_kernels_do():
    """P(s, M) is encode(s + float32(c - M)) with m = 0 (one rounding of c - M, then one of the sum:
    the kernels' fmaf(acc, sc, c - M)), not encode(float32(s - M) + c)."""
    g = torch.Generator().manual_seed(6)
    s = -torch.rand(200000, generator=g) * 20 + 3.1
    m = torch.full_like(s, 3.1 + 2.0**-20)  # non-integer: c - M rounds
    row_const = torch.tensor(R.P_LOG2_MAX, dtype=torch.float32) - m
    assert torch.equal(R.p_exp2_cast(s, m), R.fp8_e4m3(torch.exp2(s + row_const)))


def _int_scores(rows=64, keys=1000, seed=7):
    """Exact int8 dot products (D = 128) as float32, as score_parts holds them, and a float32 scale per
    row, about 1e-4 (s = acc * scale)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows, 128), generator=g).float()
    k = torch.randint(-127, 128, (keys, 128), generator=g).float()
    acc = q @ k.T
    scale = (torch.rand(rows, 1, generator=g) * 2e-4 + 5e-5).float().expand(rows, keys)
    return acc, scale


def test_quantize_p_anchors_expcast_at_each_key_blocks_integer_max():
    """quantize_p gives the speed encoding the exact scores, their scale and each key block's largest
    score a0 (what the kernel's block holds), against the running offset; a0 = the whole row's max
    instead rounds T0 = rint(fl(TOP + fl(fl(a0 scale) - M)) 2^23) elsewhere and moves codes."""
    acc, scale = _int_scores()
    s = acc.float() * scale
    run = R.running_row_offsets(s)
    m_run = run.repeat_interleave(R.K_BLOCK, dim=-1)[..., : s.shape[-1]]
    rescale = torch.exp2(m_run.double() - run[..., -1:].double())
    got = R.quantize_p(s, SPEED.with_(k_lane_scales=False), acc=acc, scale=scale)  # (lanes: tests/test_k_lanes.py)
    block_a0 = R.p_expcast(s, m_run, acc=acc, scale=scale, a0=R.block_row_max(acc, R.K_BLOCK))
    row_a0 = R.p_expcast(s, m_run, acc=acc, scale=scale, a0=acc.amax(-1, keepdim=True))
    assert torch.equal(got, block_a0.double() * rescale)
    assert (block_a0 != row_a0).sum() > 10
    assert torch.equal(R.block_row_max(acc, R.K_BLOCK)[:, 130], acc[:, 128:256].amax(-1))


def test_quantize_p_without_the_integer_scores_encodes_s_itself():
    """Without acc, s is the exact score (scale 1: u held to 2^-23), anchored at its block maxima; on
    scores whose integer form is exact (s a multiple of 2^-10) the two calls give the same P."""
    acc = torch.round(torch.randn(8, 700, generator=torch.Generator().manual_seed(8)) * 6 * 2**10)
    s = acc / 2**10
    assert torch.equal(R.quantize_p(s, SPEED), R.quantize_p(s, SPEED, acc=acc, scale=2.0**-10))
    assert not torch.equal(R.quantize_p(s, SPEED), R.quantize_p(s, SPEED, acc=acc, scale=2.0**-10 * (1 + 2.0**-12)))


# ---------------------------------------------------------------- Proposition 3.1
def _expcast_row(u, encode):
    p = torch.softmax(u.double() * math.log(2), dim=-1)
    p_hat = encode(u).double()
    return p, p_hat / p_hat.sum(-1, keepdim=True)


EXPCAST_ENCODINGS = pytest.mark.parametrize("encode", [R.p_expcast, R.p_expcast_paper], ids=["expcast", "paper"])


@EXPCAST_ENCODINGS
def test_proposition_3_1_tv_and_output_bound_in_normal_range(encode):
    g = torch.Generator().manual_seed(1)
    u = -torch.rand(4000, 256, generator=g) * 14.0
    u[:, 0] = 0.0  # row max at 0 -> code 120, all u >= -14 (normal E4M3)
    p, p_hat = _expcast_row(u, encode)
    tv = 0.5 * (p - p_hat).abs().sum(-1)
    assert tv.max().item() < 0.0364
    v = torch.randn(256, 32, generator=g, dtype=torch.float64) * torch.rand(32, generator=g, dtype=torch.float64)
    diam = torch.cdist(v, v).max()
    err = ((p - p_hat) @ v).norm(dim=-1)
    assert (err <= 0.0364 * diam).all()


@EXPCAST_ENCODINGS
def test_proposition_3_1_with_underflow_tail(encode):
    g = torch.Generator().manual_seed(2)
    u = -torch.rand(4000, 256, generator=g) * 22.0
    u[:, 0] = 0.0
    p, p_hat = _expcast_row(u, encode)
    tau = (p * (u < -14).double()).sum(-1)
    assert tau.max() > 0  # the tail really exists in this test
    tv = 0.5 * (p - p_hat).abs().sum(-1)
    assert (tv < 0.0364 + tau).all()


# ---------------------------------------------------------------- quantizers and tails
@pytest.mark.parametrize("n", [1, 77, 129])
def test_int8_blocks_tail_is_quantized_on_its_own_rows(n):
    (x,) = rand_qkv(1, 1, n, 64)[:1]
    xq, sc = R.quantize_int8_blocks(x, 64)
    for blk in range(sc.shape[-1]):
        rows = x[:, :, blk * 64 : (blk + 1) * 64]
        amax = rows.abs().max()
        assert sc[0, 0, blk] == amax / 127
        expect = torch.round(rows * (127 / amax)).clamp(-127, 127).to(torch.int8)
        assert torch.equal(xq[:, :, blk * 64 : (blk + 1) * 64], expect)


def test_zero_block_quantizes_to_zero_without_nan():
    x = torch.zeros(1, 1, 70, 64)
    x[:, :, 64:] = 1.0
    xq, sc = R.quantize_int8_blocks(x, 64)
    assert sc[0, 0, 0] == 0 and not xq[:, :, :64].any() and xq[:, :, 64:].eq(127).all()


def test_block_means_use_only_valid_rows_of_the_tail():
    v = torch.randn(1, 2, 130, 16)
    mu = R.block_means_fp16(v)
    assert mu.dtype == torch.float16 and mu.shape == (1, 2, 2, 16)
    assert torch.allclose(mu[:, :, 1].float(), v[:, :, 128:].mean(2), atol=1e-3)


def test_mean_restore_from_row_sums_is_exact_without_residual_quantization():
    """O = (P R + sum_j r_ij mu_j) / l equals P V / l when R = V - mu is not quantized."""
    g = torch.Generator().manual_seed(3)
    n = 300
    v = torch.randn(1, 1, n, 64, generator=g, dtype=torch.float64) + 5
    p = torch.rand(1, 1, 40, n, generator=g, dtype=torch.float64)
    mu = R.block_means_fp16(v).double()  # (1,1,nb,64)
    resid = v - R.expand_rows(mu, R.V_BLOCK, n)
    nb = mu.shape[2]
    row_sums = torch.stack([p[..., j * 128 : (j + 1) * 128].sum(-1) for j in range(nb)], -1)  # (1,1,40,nb)
    restored = p @ resid + row_sums @ mu
    assert torch.allclose(restored, p @ v, rtol=1e-12, atol=1e-10)


def test_vsmooth_residual_reconstructs_v_up_to_fp8_error():
    v = torch.randn(1, 2, 256, 64) * 0.1 + 3.0
    vs = R.quantize_v_vsmooth(v)
    err = rel_l2(vs.dequantized(), v)
    base_q, base_s = R.quantize_fp8_per_channel(v)
    assert err < rel_l2(base_q * base_s, v) / 5  # the mean carries most of V here


# ---------------------------------------------------------------- the whole call
def _online_softmax_emulation(q, k, v, config, steps=None):
    """A per-128-key-block online softmax with the exact running max, the way a kernel runs (the speed
    encoding on the integer scores of the block, anchored at their max); the offset increments (M_new - M_old, finite ones) are appended to `steps`."""
    q_q, q_sc, k_q, k_sc = R.quantize_qk(q, k, config)
    v_hat = R.dequantized_v(v, config).double()
    dots, scale = R.score_parts(q_q, q_sc, k_q, k_sc, k.shape[-2])
    s = dots * scale
    n = k.shape[-2]
    m = torch.full(s.shape[:-1] + (1,), -math.inf)
    acc = torch.zeros(q.shape, dtype=torch.float64)
    l = torch.zeros(s.shape[:-1] + (1,), dtype=torch.float64)
    for j in range(0, n, R.K_BLOCK):
        s_blk = s[..., j : j + R.K_BLOCK]
        m_new = torch.maximum(m, s_blk.amax(-1, keepdim=True))
        if steps is not None:
            steps.append((m_new - m)[torch.isfinite(m)])
        alpha = torch.exp2(m.double() - m_new.double())
        if config.p == "expcast":  # the integer scores, anchored at the block's largest
            d_blk = dots[..., j : j + R.K_BLOCK]
            p = R.p_expcast(s_blk, m_new, acc=d_blk, scale=scale[..., j : j + R.K_BLOCK],
                            a0=d_blk.amax(-1, keepdim=True)).double()
        else:
            p = R.P_ENCODERS[config.p](s_blk, m_new).double()
        acc = alpha * acc + p @ v_hat[..., j : j + R.K_BLOCK, :]
        l = alpha * l + p.sum(-1, keepdim=True)
        m = m_new
    return acc / l


@pytest.mark.parametrize("config", [FIDELITY.without_refinements(), SPEED, SPEED.with_(p="expcast_paper"), PLAIN_8BIT],
                         ids=lambda c: c.tag)
def test_online_softmax_with_the_running_max_matches_vectorized_reference(config):
    q, k, v = rand_qkv(1, 2, 700, 64, seed=4)
    q = q * 3  # peaky rows so the running max really moves between blocks
    steps = []
    online = _online_softmax_emulation(q, k, v, config, steps)
    steps = torch.cat(steps)
    moved = steps[steps > 0]
    assert moved.numel() > 100 and (moved != moved.round()).all()  # non-integer increments
    two_pass = R.vc_attention_reference(q, k, v, config, parts=True).out
    assert rel_l2(online, two_pass) < 1e-12


@pytest.mark.parametrize("n", [1, 77, 129, 4097])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_odd_sizes_both_layouts_and_head_dims(n, d):
    if n == 4097 and d != 128:
        pytest.skip("one head dim is enough at N=4097 on 2 CPU cores")
    b, h = (2, 2) if n < 4097 else (1, 1)
    q, k, v = rand_qkv(b, h, n, d, torch.bfloat16, seed=n + d)
    exact = R.exact_attention(q, k, v)
    configs = (FIDELITY, SPEED, VCConfig(qk="fp8")) if n < 4097 else (SPEED,)
    for config in configs:
        out = R.vc_attention_reference(q, k, v, config)
        assert out.dtype == torch.bfloat16 and out.shape == q.shape
        assert rel_l2(out, exact) < 0.08  # FP8 V on zero-mean random V: ~3-5%
        out_t = R.vc_attention_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), config, layout="bnhd")
        assert torch.equal(out_t.transpose(1, 2), out)


def test_query_chunking_does_not_change_the_result():
    q, k, v = rand_qkv(1, 1, 300, 64, seed=5)
    a = R.vc_attention_reference(q, k, v, SPEED, query_chunk=64, parts=True).out
    b = R.vc_attention_reference(q, k, v, SPEED, query_chunk=1024, parts=True).out
    assert torch.equal(a, b)


def test_mismatched_shapes_raise_a_sentence():
    q = torch.randn(1, 1, 10, 64)
    with pytest.raises(ValueError, match="self-attention"):
        R.vc_attention_reference(q, q[:, :, :5], q[:, :, :5], FIDELITY)
    with pytest.raises(ValueError, match="layout"):
        R.vc_attention_reference(q, q, q, FIDELITY, layout="nhd")


def test_kmeans_empty_cluster_keeps_its_centroid_and_is_deterministic():
    x = torch.zeros(1, 1, 8, 2)
    x[..., 4:, 0] = 10.0
    init = torch.tensor([[[[0.0, 0.0], [10.0, 0.0], [100.0, 100.0]]]])
    labels, cents = R.kmeans_labels(x, 3, 3, init_centroids=init)
    assert labels.flatten().tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert cents[0, 0, 2].tolist() == [100.0, 100.0]
    v = torch.randn(2, 2, 300, 16)
    a, _ = R.kmeans_labels(v, 8, 4, seed=7)
    b, _ = R.kmeans_labels(v, 8, 4, seed=7)
    assert torch.equal(a, b)


def test_bnhd_views_with_n_a_multiple_of_the_block_need_no_copy():
    q, k, v = rand_qkv(1, 2, 256, 64, seed=6)
    a = R.vc_attention_reference(q, k, v, FIDELITY)
    b = R.vc_attention_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), FIDELITY, layout="bnhd")
    assert torch.equal(a, b.transpose(1, 2))


def _near_fp16_max(seed=0):
    """Sharp attention over V just below 65504: V-Smooth's FP8 residual rounds some values past it."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(1, 2, 256, 64, generator=g) * 30).half()
    k = (torch.randn(1, 2, 256, 64, generator=g) * 30).half()
    v = (65504 - 6000 * torch.rand(1, 2, 256, 64, generator=g)).half()
    return q, k, v


@pytest.mark.parametrize("config", [FIDELITY, SPEED], ids=lambda c: c.tag)
def test_fp16_output_saturates_at_the_largest_finite_value(config):
    """Dequantized V past fp16's range gave inf (106 of 32,768 here; SDPA none): the store saturates."""
    from vc_attention.kernels.operand_emulation import emulate_attention
    from vc_attention.kernels.prepare_reference import prepare_reference

    q, k, v = _near_fp16_max()
    out = R.vc_attention_reference(q, k, v, config)
    assert torch.isfinite(out).all() and (out == 65504).any()
    emulated = emulate_attention(prepare_reference(q, k, v, None, config), config, torch.float16)
    assert torch.isfinite(emulated).all()


def test_saturation_keeps_nan_and_leaves_bf16_alone():
    x = torch.tensor([70000.0, -1e30, float("inf"), float("nan"), 65519.0, 1.5], dtype=torch.float64)
    half = R.to_output_dtype(x, torch.float16)
    assert half[[0, 1, 2, 4, 5]].tolist() == [65504.0, -65504.0, 65504.0, 65504.0, 1.5] and math.isnan(half[3])
    assert torch.equal(R.to_output_dtype(x, torch.bfloat16).view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
