"""K scales per 256 keys (VCConfig.k_scale_rows): the spec, the operand contract and the configurations
that carry it (the Hopper speed loop's one row maximum per 256-key step, docs/kernel-notes.md section 27). The node's
presets follow config.SPEED (tests/test_node_presets.py).

  pytest -q tests/test_k_scale_pairs.py
"""
import pytest
import torch

from vc_attention.kernels import reference as R
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.prepare_reference import prepare_reference


# the speed loop's pairing without K scales per lane (config.SPEED has them: tests/test_k_lanes.py), so the per-128-key
# scale layout and the anchors below are the pairing's alone
PAIRED = SPEED.with_(k_lane_scales=False)


def _k(n: int, d: int = 64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 2, n, d, generator=gen)
    k[..., 300:420, :] *= 4.0  # one loud stretch, so neighbouring 128-key blocks have different amaxes
    return k.bfloat16()


def test_config_field_its_values_and_its_pairing():
    assert VCConfig().k_scale_rows == 128 and PLAIN_8BIT.k_scale_rows == 128 and "-k" not in VCConfig().tag
    assert PAIRED.k_scale_rows == 256 and PAIRED.tag.endswith("-k256")
    # fidelity pairs its K scales too (its exp2 256-key loop on the Hopper kernel), with its 128-row means
    assert FIDELITY.k_scale_rows == 256 and FIDELITY.v_mean_rows == 128 and FIDELITY.tag == "int8-vsmooth-mixed-k256-lo30"
    for bad in (64, 512, True, "256"):
        with pytest.raises(ValueError, match="k_scale_rows must be one of"):
            PAIRED.with_(k_scale_rows=bad)
    # the loop that pairs the K scales is the one that pairs the means: 256 needs 256-row means, no rank
    with pytest.raises(ValueError, match=r"needs v_mean_rows=256 \(or p='exp2' / 'mixed'\) and v_rank=0"):
        VCConfig(p="expcast", k_scale_rows=256)
    with pytest.raises(ValueError, match=r"needs v_mean_rows=256 \(or p='exp2' / 'mixed'\) and v_rank=0"):
        PAIRED.with_(v_mean_merge=False, v_mean_rows=128)
    with pytest.raises(ValueError, match="and v_rank=0"):
        FIDELITY.with_(k_scale_rows=256, v_rank=2)
    with pytest.raises(ValueError, match="needs v='vsmooth'"):
        FIDELITY.with_(v="per_channel")  # per-channel V reads K scales per tile in every kernel
    # exp2 P has no per-step anchor: fidelity's K scales may pair with its 128-row means; a rank turns them back
    assert VCConfig(k_scale_rows=256) == FIDELITY.without_refinements() and FIDELITY.with_rank(2).k_scale_rows == 128
    assert FIDELITY.with_rank(2).with_rank(0).k_scale_rows == 128  # with_rank(0) keeps what it is given
    assert PAIRED.with_(v_mean_merge=False, v_mean_rows=128, k_scale_rows=128).k_scale_rows == 128
    ranked = PAIRED.with_rank(2)  # the low-rank loop anchors per tile: back to 128
    assert ranked.k_scale_rows == 128 and ranked.v_rank == 2 and PAIRED.with_rank(0) == PAIRED


@pytest.mark.parametrize("n", [1000, 1100, 300])
def test_quantize_qk_takes_one_scale_per_256_keys_stored_per_128(n):
    """k_scale keeps one entry per 128 keys; at 256 the entries are equal in pairs and each is the pair's
    amax / 127 of the smoothed K (a lone last 128-key slot: its own rows); the codes use that scale."""
    k = _k(n, 128)
    q = torch.randn(1, 2, n, 128).bfloat16()
    _, _, k_q, k_sc = R.quantize_qk(q, k, PAIRED)
    _, _, k_q128, k_sc128 = R.quantize_qk(q, k, PAIRED.with_(k_scale_rows=128))
    slots = -(-n // 128)
    assert k_sc.shape == k_sc128.shape == (1, 2, slots)
    ks = R.smooth_k(k)[0]
    for s in range(slots):
        rows = ks[..., 256 * (s // 2): min(256 * (s // 2) + 256, n), :]
        assert torch.equal(k_sc[..., s], rows.abs().amax(dim=(-1, -2)) / R.INT8_MAX)
    pairs = k_sc[..., : slots // 2 * 2].reshape(1, 2, -1, 2)
    assert torch.equal(pairs[..., 0], pairs[..., 1])
    assert not torch.equal(k_sc, k_sc128)  # the loud stretch: 128-key blocks differ within a pair
    assert torch.equal(k_q, R.quantize_int8_blocks(ks, 256)[0]) and not torch.equal(k_q, k_q128)


def test_head_dim_64_keeps_one_k_scale_per_128_keys():
    """Only the head dim 128 speed loop takes one K scale per 256-key step (reference.PAIRED_K_HEAD_DIMS):
    at 64 every kernel steps 128 keys, so PAIRED's and FIDELITY's K are quantized per 128 keys there."""
    assert R.k_scale_rows(PAIRED, 128) == 256 and R.k_scale_rows(PAIRED, 64) == 128
    assert R.k_scale_rows(FIDELITY, 128) == 256 and R.k_scale_rows(FIDELITY, 64) == 128
    assert R.k_scale_rows(PLAIN_8BIT, 128) == 128
    for d, paired in ((64, False), (128, True)):
        k = _k(1100, d)
        q = torch.randn(1, 2, 1100, d).bfloat16()
        speed = R.quantize_qk(q, k, PAIRED)
        per_tile = R.quantize_qk(q, k, PAIRED.with_(k_scale_rows=128))
        same = all(torch.equal(a, b) for a, b in zip(speed, per_tile))
        assert same != paired, d


def test_speed_encoding_anchors_a_256_key_step_at_one_maximum():
    """With one K scale per 256 keys the step's codes are anchored at the step's largest integer score
    (reference.quantize_p: a0 over min(offset_block, k_scale_rows) keys), which is what the paired loop
    computes; with 128-key scales each tile keeps its own anchor. The anchor is part of the encoding: the
    integer slope A = rint(scale 2^23) is not exact, so the codes of a key depend on how far it sits from its
    anchor (int8 dot products over D = 128 span +-2^21)."""
    gen = torch.Generator().manual_seed(3)
    acc = torch.randint(-2000000, 2000000, (1, 1, 8, 512), generator=gen).float()
    scale = torch.full_like(acc, 2.0e-5)  # A = rint(167.77) = 168
    s = acc * scale
    got = R.quantize_p(s, PAIRED, 256, acc=acc, scale=scale)
    run = R.running_row_offsets(s, 256)
    m_run = run.repeat_interleave(256, dim=-1)
    p = R.p_expcast(s, m_run, acc=acc, scale=scale, a0=R.block_row_max(acc, 256))
    assert torch.equal(got, p.double() * torch.exp2(m_run.double() - run[..., -1:].double()))
    a0_128 = R.block_row_max(acc, 128)
    assert not torch.equal(a0_128, R.block_row_max(acc, 256))
    per_tile = R.quantize_p(s, PAIRED.with_(k_scale_rows=128), 256, acc=acc, scale=scale)
    assert not torch.equal(got, per_tile)  # some codes move with the anchor
    assert float((got - per_tile).abs().max() / got.abs().max()) < 2e-2


def test_prepare_reference_holds_the_pairs_in_the_contract():
    n = 1100
    gen = torch.Generator().manual_seed(5)
    q, v = (torch.randn(1, 2, n, 128, generator=gen).bfloat16() for _ in range(2))
    k = _k(n, 128, seed=5)
    ops = prepare_reference(q, k, v, None, PAIRED)
    assert ops.k_scale.shape == (1, 2, 9)
    assert torch.equal(ops.k_scale[..., 0:8:2], ops.k_scale[..., 1:8:2])
    other = prepare_reference(q, k, v, None, PAIRED.with_(k_scale_rows=128))
    assert not torch.equal(other.k_scale[..., 0:8:2], other.k_scale[..., 1:8:2])


def test_sm90_passes_segment_flags_to_the_paired_loop_only(monkeypatch):
    """vsmooth mode 2 (means and K scales paired) is the loop that reads the segment flags; with K scales per
    128 keys the per-tile loop (mode 1) runs, and the flags must stay behind (the binding refuses them there).
    Paired K scales add VSMOOTH_PAIRED_K (fidelity's exp2 loop reads one per step then): PAIRED's, FIDELITY's, and
    neither at head dim 64 nor with K scales per 128 keys."""
    from vc_attention.kernels.constants import VSMOOTH_PAIRED_K

    from types import SimpleNamespace

    from vc_attention.kernels import backend_sm90

    calls = []
    monkeypatch.setattr(backend_sm90, "extension", lambda: SimpleNamespace(attention=lambda *a: calls.append(a)))
    monkeypatch.setattr(backend_sm90.torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    flags = torch.ones(1, 2, 4, dtype=torch.uint8)
    def ops(d):
        return SimpleNamespace(q_q=torch.empty(1, 2, 512, d, dtype=torch.int8), q_scale=None, k_q=None, k_scale=None,
                               v_t=None, v_scale=None, v_mean=None, v_low_t=None, v_low_basis=None, v_low_scale=None,
                               n_tokens=500, v_seg_end=flags, v_lo_t=None, v_lo_sel=None)

    backend_sm90.attention_from_operands(ops(128), PAIRED, torch.empty(1, 2, 500, 128), "bhnd")
    backend_sm90.attention_from_operands(ops(128), PAIRED.with_(k_scale_rows=128), torch.empty(1, 2, 500, 128), "bhnd")
    # head dim 64: the spec keeps K scales per 128 keys (reference.k_scale_rows), so the per-tile mode
    backend_sm90.attention_from_operands(ops(64), PAIRED, torch.empty(1, 2, 500, 64), "bhnd")
    backend_sm90.attention_from_operands(ops(128), FIDELITY, torch.empty(1, 2, 500, 128), "bhnd")
    backend_sm90.attention_from_operands(ops(128), FIDELITY.with_(k_scale_rows=128), torch.empty(1, 2, 500, 128), "bhnd")
    backend_sm90.attention_from_operands(ops(64), FIDELITY, torch.empty(1, 2, 500, 64), "bhnd")
    (paired, per_tile, d64, fidelity, fidelity_per_tile, fidelity_d64) = calls
    # (the arguments: ..., vsmooth 13, stream 14, v_seg_end 15, then the refinements v_lo_t, v_lo_sel, mixed)
    assert paired[13] == 2 | VSMOOTH_PAIRED_K and paired[15] is flags and paired[18] is False
    assert per_tile[13] == 1 and per_tile[15] is None
    assert d64[13] == 1 and d64[15] is None
    assert fidelity[13] == 1 | VSMOOTH_PAIRED_K and fidelity[15] is None and fidelity[18] is (FIDELITY.p == "mixed")
    assert fidelity_per_tile[13] == 1 and fidelity_d64[13] == 1
    assert backend_sm90.vsmooth_mode(PLAIN_8BIT) == 0


def test_fidelity_with_paired_k_scales_keeps_its_means_and_exp2_codes():
    """FIDELITY (k_scale_rows 256; the exp2 loop of VC_SM90_KPAIR_EXP2 builds): K quantized per 256 keys,
    the V-Smooth means still per 128 rows, and exp2 P has no anchor, so the float64 emulation at the kernel's
    256-key step equals the one at 128 keys' anchors up to the K scales alone: the same V operands, K scales
    equal in pairs, and an output within the quantization noise of fidelity's."""
    n = 1100
    gen = torch.Generator().manual_seed(7)
    q, v = (torch.randn(1, 2, n, 128, generator=gen).bfloat16() for _ in range(2))
    k = _k(n, 128, seed=7)
    paired, per_tile = FIDELITY, FIDELITY.with_(k_scale_rows=128)
    ops, base = prepare_reference(q, k, v, None, paired), prepare_reference(q, k, v, None, per_tile)
    assert torch.equal(ops.v_mean, base.v_mean) and torch.equal(ops.v_t.float(), base.v_t.float())
    pairs = ops.k_scale[..., : ops.k_scale.shape[-1] // 2 * 2].reshape(1, 2, -1, 2)
    assert torch.equal(pairs[..., 0], pairs[..., 1]) and not torch.equal(ops.k_scale, base.k_scale)
    out = R.vc_attention_reference(q, k, v, paired, parts=True, offset_block=256).out
    ref = R.vc_attention_reference(q, k, v, per_tile, parts=True, offset_block=256).out
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 128 ** 0.5, dim=-1) @ v.double()
    err, err_base = ((t - exact).norm() / exact.norm() for t in (out, ref))
    assert 0 < float(err) < 1.5 * float(err_base)
