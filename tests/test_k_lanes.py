"""The spec of K scales per MMA lane (kernels/k_lanes.py, VCConfig.k_lane_scales): the lane order, the lane
quantizer, the speed encoding's per-lane anchor, and the call through the reference and the operand contract."""
import pytest
import torch

from vc_attention.kernels import k_lanes, reference
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.operand_emulation import emulate_attention
from vc_attention.kernels.prepare_reference import prepare_reference


def _keys_of_varied_norm(n, d=128, seed=0, heads=2):
    """Keys whose norms spread over a factor of 8 (what the lane order sorts by), queries and values."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n, d, generator=g) * 1.5
    k = torch.randn(1, heads, n, d, generator=g) * torch.exp2(3 * torch.rand(1, heads, n, 1, generator=g))
    v = torch.randn(1, heads, n, d, generator=g) + 2.0
    return q, k, v


def test_the_lane_of_a_key_is_the_quad_lane_of_the_kernels_score_layout():
    # sm90 key_of_column / the mma kernels' key_of: key 16 (c >> 1) + 4 t + 2 (c & 1) + e sits in lane t
    lanes = k_lanes.key_lanes(128)
    for c in range(16):
        for t in range(4):
            for e in range(2):
                assert lanes[16 * (c >> 1) + 4 * t + 2 * (c & 1) + e] == t


def test_lane_position_puts_each_quartile_of_the_ranks_on_one_lane():
    pos = k_lanes.lane_position(torch.arange(128))
    assert sorted(pos.tolist()) == list(range(128))
    assert torch.equal(k_lanes.key_lanes(128)[pos], torch.arange(128) // 32)


def test_lane_order_sorts_each_full_block_by_amax_and_keeps_the_tail():
    ks = torch.randn(2, 3, 300, 16)
    order = k_lanes.lane_order(ks)
    assert torch.equal(order[..., 256:], torch.arange(256, 300).expand(2, 3, 44))  # partial block unchanged
    for blk in range(2):
        local = order[..., blk * 128:(blk + 1) * 128]
        assert torch.equal(local.sort(-1).values, torch.arange(blk * 128, (blk + 1) * 128).expand(2, 3, 128))
        amax = ks.abs().amax(-1).gather(-1, local)  # (2,3,128): amax at each position
        by_rank = amax[..., k_lanes.lane_position(torch.arange(128))]
        assert (by_rank[..., 1:] <= by_rank[..., :-1]).all()


def test_lane_order_breaks_ties_by_position():
    ks = torch.ones(1, 1, 128, 4)  # every key ties: rank r is key r
    order = k_lanes.lane_order(ks)
    assert torch.equal(order[0, 0, k_lanes.lane_position(torch.arange(128))], torch.arange(128))


def test_quantize_int8_lanes_takes_each_lanes_own_amax():
    x = torch.randn(1, 2, 300, 32) * torch.rand(1, 2, 300, 1) * 5
    q, scale = k_lanes.quantize_int8_lanes(x, 256)
    assert scale.shape == (1, 2, 2, 4)
    lanes = k_lanes.key_lanes(300)
    for blk in range(2):
        for t in range(4):
            keys = [j for j in range(blk * 256, min(300, (blk + 1) * 256)) if lanes[j] == t]
            assert torch.equal(scale[:, :, blk, t], x[:, :, keys].abs().amax((-1, -2)) / 127)
            err = (q[:, :, keys].float() * scale[:, :, blk, t, None, None] - x[:, :, keys]).abs()
            assert (err <= scale[:, :, blk, t, None, None] / 2 * (1 + 1e-5)).all()
    assert q.abs().max() == 127


def test_lane_block_row_max_is_the_max_over_the_block_and_lane():
    x = torch.randint(-1000, 1000, (3, 300)).float()
    got = k_lanes.lane_block_row_max(x, 256)
    lanes = k_lanes.key_lanes(300)
    for j in (0, 5, 17, 255, 256, 299):
        blk = j // 256
        same = [i for i in range(blk * 256, min(300, blk * 256 + 256)) if lanes[i] == lanes[j]]
        assert torch.equal(got[:, j], x[:, same].amax(-1))


@pytest.mark.parametrize("base", [FIDELITY, SPEED], ids=["fidelity", "speed"])
@pytest.mark.parametrize("n", [700, 1024, 2053])  # 2053: the last K-scale block has 5 keys, lanes with none
def test_the_operand_emulation_of_the_lane_operands_is_the_reference(base, n):
    """prepare_reference writes lane-ordered K / V and (B,H,n_pad/128,4) K scales; what a kernel computes from them
    is the reference's call (the speed encoding anchored per lane)."""
    config = base.with_(k_lane_scales=True)
    q, k, v = _keys_of_varied_norm(n)
    perm = torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(h)) for h in range(2)])[None]
    ops = prepare_reference(q, k, v, perm, config)
    assert ops.k_scale.shape == (1, 2, -(-n // 128), 4)
    want = reference.vc_attention_reference(q, k, v, config, perm=perm, offset_block=256)
    got = emulate_attention(ops, config, torch.float32, 256)
    assert (got - want).abs().max() < 1e-5


def test_lane_scales_lower_the_scores_error_on_keys_of_varied_norm():
    """The point of the lane order: three of a block's four lanes get a smaller amax, so their keys' INT8 grid is
    finer (a third less score error here; end to end on the video-like data: docs/fidelity-study.md)."""
    q, k, v = _keys_of_varied_norm(2048, seed=3)

    def score_rms_error(config):
        kb, _ = reference.lane_sorted(k, v, config)
        q_q, q_sc, k_q, k_sc = reference.quantize_qk(q, kb, config)
        s = reference.scores_log2(q_q, q_sc, k_q, k_sc, kb.shape[-2]).double()
        exact = (q.double() * reference.qk_scale(128, None)) @ reference.smooth_k(kb)[0].double().transpose(-1, -2)
        return (s - exact).square().mean().sqrt().item()

    assert score_rms_error(FIDELITY.with_(k_lane_scales=True)) < 0.8 * score_rms_error(FIDELITY)


def test_the_speed_anchor_per_lane_keeps_every_code_at_or_below_the_top():
    """With lane scales a lane anchored at another lane's max could pass the running max (T0 out of range): the spec
    anchors each lane at its own keys' max, so no probability exceeds 448."""
    q, k, v = _keys_of_varied_norm(1024, seed=5)
    config = SPEED.with_(k_lane_scales=True)
    kb, _ = reference.lane_sorted(k, v, config)
    q_q, q_sc, k_q, k_sc = reference.quantize_qk(q, kb, config)
    acc, sc = reference.score_parts(q_q, q_sc, k_q, k_sc, 1024)
    p = reference.quantize_p(acc * sc, config, 256, acc=acc, scale=sc, lanes=True)
    final = reference.running_row_offsets(acc * sc, 256)[..., -1:]
    assert (p * 0 == 0).all() and (p.amax(-1, keepdim=True) <= 448 * 1.0001).all()
    assert (reference.row_offset(acc * sc) == final).all()


def test_head_dim_64_takes_no_lanes():
    q, k, v = _keys_of_varied_norm(300, d=64)
    with_lanes = reference.vc_attention_reference(q, k, v, FIDELITY.with_(k_lane_scales=True))
    assert torch.equal(with_lanes, reference.vc_attention_reference(q, k, v, FIDELITY))
    assert prepare_reference(q, k, v, None, FIDELITY.with_(k_lane_scales=True)).k_scale.dim() == 3


@pytest.mark.parametrize("changes", [dict(qk="fp8"), dict(v="per_channel", k_scale_rows=128), dict(k_scale_rows=128),
                                     dict(v_rank=2, k_scale_rows=128)])
def test_the_config_refuses_lane_scales_outside_the_paired_loops(changes):
    with pytest.raises(ValueError, match="k_lane_scales"):
        FIDELITY.with_(k_lane_scales=True, **changes)


def test_config_tag_and_rank():
    config = SPEED.with_(k_lane_scales=True)
    assert config.tag.endswith("-lanes")
    assert not config.with_rank(3).k_lane_scales
    with pytest.raises(ValueError, match="True or False"):
        VCConfig(k_lane_scales=1)
    assert not PLAIN_8BIT.k_lane_scales and not FIDELITY.k_lane_scales


def test_a_backend_without_lane_kernels_refuses_the_call_with_a_sentence():
    """backends.call_reason: lane scales where the spec takes them (head dim 128) need a backend that declares them;
    at head dim 64 the spec takes none, so nothing is refused; every registered backend declares them."""
    from vc_attention.kernels import backends

    plain = backends.Constraints(device_type="any")
    q128, q64 = torch.zeros(1, 1, 8, 128), torch.zeros(1, 1, 8, 64)
    base = FIDELITY.without_refinements()  # (the preset's refinements are another question: tests/test_refinements.py)
    reason = backends.call_reason(plain, base.with_(k_lane_scales=True), "bhnd", q128)
    assert reason is not None and "k_lane_scales" in reason
    assert backends.call_reason(plain, base.with_(k_lane_scales=True), "bhnd", q64) is None
    assert backends.call_reason(plain, base, "bhnd", q128) is None
    for name in ("reference", "sm90", "mma"):
        assert backends.get(name).constraints.k_lane_scales, name


def test_the_presets_give_lanes_to_exactly_the_expcast_int8_vsmooth_configurations():
    """config.SPEED carries lane scales (kernel-notes 42): every widget combination builds a valid configuration, with
    lane scales exactly for INT8 Q/K with V-Smooth and ExpCast (the speed loops; fidelity's exp2 loop runs without)."""
    from vc_attention.nodes import presets

    assert SPEED.k_lane_scales and not FIDELITY.k_lane_scales
    for precision in ("int8-qk/fp8-pv", "fp8-qk/fp8-pv"):
        for v_smooth in (True, False):
            for expcast in (True, False):
                config = presets.config_from_widgets(dict(precision=precision, v_smooth=v_smooth, expcast=expcast))
                assert config.k_lane_scales == (precision.startswith("int8") and v_smooth and expcast), \
                    (precision, v_smooth, expcast)
