"""The V-Smooth residual's second E4M3 term on its busiest channels (VCConfig.v_lo_channels; reference
quantize_v_vsmooth's lo_channels, v_lo_channel_policy; the operands v_lo_t / v_lo_sel). Spec only: no kernel declares it
yet (docs/fidelity-study.md "A second E4M3 term for the residual's busiest channels")."""
import dataclasses

import pytest
import torch

from vc_attention.kernels import backends, operand_emulation, prepare_reference
from vc_attention.kernels import reference as R
from vc_attention.kernels.config import FIDELITY as FIDELITY_PRESET, SPEED, VCConfig

# fidelity without its refinements (the preset carries the term on 32 channels and the mixed encoding since kernel-notes
# section 38): the base these tests add the term to
FIDELITY = FIDELITY_PRESET.without_refinements()


def busy_channels_v(n=700, d=64, seed=0):
    """bf16 V whose channels have very different residual energy (scale 0.1 to 3) and offsets."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.1, 3.0, d)[torch.randperm(d, generator=g)]
    return (torch.randn(1, 2, n, d, generator=g) * scale + torch.randn(d, generator=g)).bfloat16()


def test_the_policy_takes_the_channels_with_the_most_residual_energy_in_ascending_order():
    resid = torch.zeros(1, 1, 5, 8)
    resid[..., [6, 1, 3]] = torch.tensor([3.0, 2.0, 1.0])  # energies 9 * 5, 4 * 5, 1 * 5; the rest 0 (ties)
    assert R.v_lo_channel_policy(resid, 2).tolist() == [[[1, 6]]]
    assert R.v_lo_channel_policy(resid, 4).tolist() == [[[0, 1, 3, 6]]]  # the zero-energy tie goes to channel 0


def test_selected_channels_carry_hi_plus_lo_and_the_others_are_unchanged():
    v = busy_channels_v()
    plain, lo = R.quantize_v_vsmooth(v), R.quantize_v_vsmooth(v, lo_channels=16)
    assert lo.lo_q.shape == (1, 2, 700, 16) and lo.lo_sel.shape == (1, 2, 16)
    err_plain = (plain.dequantized() - v.float()).pow(2).sum(-2)
    err_lo = (lo.dequantized() - v.float()).pow(2).sum(-2)
    chosen = torch.zeros_like(err_lo, dtype=torch.bool).scatter(-1, lo.lo_sel, True)
    assert torch.equal(err_lo[~chosen], err_plain[~chosen])
    # hi + lo is within 2^-8 of the scaled residual where hi alone is within 2^-4: the chosen channels' error falls
    # by more than an order of magnitude (the residual against the fp16 mean is what both quantize)
    assert bool((err_lo[chosen] < 0.02 * err_plain[chosen]).all())
    # and they are the busiest: every chosen channel had at least the plain error of every other one
    assert err_plain[chosen].min() >= err_plain[~chosen].max() * 0.5


def test_lo_codes_are_the_rounding_error_of_the_first_term_in_e4m3():
    v = busy_channels_v(seed=1)
    vs = R.quantize_v_vsmooth(v, lo_channels=16)
    resid = v.float() - R.expand_rows(vs.mean.float(), R.V_BLOCK, 700)
    amax = R.channel_absmax(resid)
    x = resid * torch.where(amax > 0, R.E4M3_MAX / amax, torch.zeros_like(amax))
    pick = vs.lo_sel.unsqueeze(-2).expand(-1, -1, 700, -1)
    hi = R.fp8_e4m3(x)
    assert torch.equal(vs.residual_q, hi)
    assert torch.equal(vs.lo_q, R.fp8_e4m3(x.gather(-1, pick) - hi.gather(-1, pick)))
    assert torch.equal(vs.lo_q, vs.lo_q.to(torch.float8_e4m3fn).float())  # E4M3 values


def test_a_given_channel_choice_is_used_and_a_misshaped_one_refused():
    v = busy_channels_v()
    sel = torch.arange(16).expand(1, 2, 16)
    assert torch.equal(R.quantize_v_vsmooth(v, lo_channels=16, lo_sel=sel).lo_sel, sel)
    with pytest.raises(ValueError, match=r"lo_sel must be \(B,H,16\)"):
        R.quantize_v_vsmooth(v, lo_channels=16, lo_sel=torch.arange(8).expand(1, 2, 8))
    with pytest.raises(ValueError, match="takes no low-rank term"):
        R.quantize_v_vsmooth(v, R.lowrank_basis(v, 2), lo_channels=16)


def test_the_configuration_field():
    assert VCConfig().v_lo_channels == 0 and "-lo" not in FIDELITY.tag
    assert FIDELITY.with_(v_lo_channels=32).tag.endswith("-lo32")
    assert FIDELITY.with_(v_lo_channels=30).tag.endswith("-lo30")  # the term beside the row sums (Hopper VLO = 30)
    for bad in (8, 64, True, "16"):
        with pytest.raises(ValueError, match="v_lo_channels must be one of"):
            FIDELITY.with_(v_lo_channels=bad)
    with pytest.raises(ValueError, match="needs v='vsmooth' and v_rank=0"):
        VCConfig(v="per_channel", v_lo_channels=16)
    assert FIDELITY.with_(v_lo_channels=16).with_rank(6).v_lo_channels == 0


def test_sm90_claims_the_presets_channels_the_reference_runs_every_count():
    q, q128 = torch.zeros(1, 2, 8, 64), torch.zeros(1, 2, 8, 128)
    config = FIDELITY.with_(v_lo_channels=16)
    for name in ("sm90", "mma"):
        # the backend's declarations with the device checks taken out: what remains is the term
        c = dataclasses.replace(backends.get(name).constraints, device_type="any", dtypes=None, aligned_rows=False)
        assert backends.call_reason(c, config.with_(v_lo_channels=0), "bhnd", q) is None
        assert "v_lo_channels" in backends.call_reason(c, config, "bhnd", q)
    # sm90's refined fidelity kernels: 30 channels (constants.SM90_V_LO_CHANNELS: the preset's), head dim 128 only
    from vc_attention.kernels import backend_sm90

    sm90 = dataclasses.replace(backends.get("sm90").constraints, device_type="any", dtypes=None, aligned_rows=False)
    assert 16 not in sm90.v_lo_channels and 32 not in sm90.v_lo_channels
    assert (FIDELITY_PRESET.v_lo_channels in sm90.v_lo_channels) == backend_sm90.REFINEMENTS_DECLARED
    if backend_sm90.REFINEMENTS_DECLARED:
        assert backends.call_reason(sm90, FIDELITY_PRESET, "bhnd", q128) is None
        assert "head dim 128" in backends.call_reason(sm90, FIDELITY_PRESET, "bhnd", q)
    assert backends.call_reason(backends.get("reference").constraints, config, "bhnd", q) is None


@pytest.mark.parametrize("config", [FIDELITY.with_(k_scale_rows=128, v_lo_channels=16), SPEED.with_(v_lo_channels=32)])
def test_the_operands_carry_the_term_and_emulate_the_reference(config):
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, 2, 300, 128, generator=g).bfloat16() for _ in range(2))
    v = busy_channels_v(n=300, d=128, seed=3)
    perm = torch.stack([torch.randperm(300, generator=g) for _ in range(2)])[None]
    ops = prepare_reference.prepare_reference(q, k, v, perm, config)
    lanes = config.v_lo_channels
    assert ops.v_lo_t.shape == (1, 2, lanes, ops.n_pad) and ops.v_lo_t.dtype == torch.float8_e4m3fn
    assert ops.v_lo_sel.shape == (1, 2, lanes) and ops.v_lo_sel.dtype == torch.int32
    assert not ops.v_lo_t[..., 300:].float().any()  # padded keys carry no term
    step = 256 if config.v == "vsmooth" else 128
    emulated = operand_emulation.emulate_attention(ops, config, torch.float64, offset_block=step)
    spec = R.vc_attention_reference(q, k, v, config, perm=perm, parts=True, offset_block=step).out
    assert (emulated - spec).abs().max().item() < 1e-6
    without = R.vc_attention_reference(q, k, v, config.with_(v_lo_channels=0), perm=perm, parts=True,
                                       offset_block=step).out
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 128 ** 0.5, -1) @ v.double()
    assert (spec - exact).norm() < (without - exact).norm()


def test_the_study_tool_measures_every_row_on_one_case():
    # bench/v_lo_study.py (docs/fidelity-study.md, last section): one small case, the second term lowers the error
    from vc_attention.bench import fidelity_study, v_lo_study

    case = fidelity_study.make_case("video", 4096, 1, 32, 0, fidelity_study.Grouping(32, 1, "chain"))
    rows = v_lo_study.case_rows(case)
    assert all(0.0 < err < 0.1 for err in rows.values()), rows
    one_term = rows["exp2, second term on 0 channels (residual energy)"]
    assert rows["exp2, second term on 128 channels (residual energy)"] < one_term


def test_a_variant_library_is_checked_against_the_spec_its_kernels_implement():
    # bench/sm90_check.py: which configuration a variant library's kernel runs for each case (its gate's spec)
    from vc_attention.bench.sm90_check import Sm90Library
    from vc_attention.kernels.config import PLAIN_8BIT

    lib = object.__new__(Sm90Library)  # the spec mapping only: no library loaded
    lib.chord_eighths, lib.v_lo_channels = 0, 32
    assert lib.spec(FIDELITY, 128) == FIDELITY.with_(v_lo_channels=32)  # the paired-K exp2 kernel
    assert lib.spec(FIDELITY.with_(k_lane_scales=True), 128).v_lo_channels == 32  # its lane twin
    for config, d in ((FIDELITY, 64), (FIDELITY.with_(k_scale_rows=128), 128), (SPEED, 128), (PLAIN_8BIT, 128)):
        assert lib.spec(config, d) == config  # the kernels without the term
    lib.chord_eighths = 4
    assert lib.spec(FIDELITY, 128) == FIDELITY.with_(p="mixed", v_lo_channels=32)
    assert lib.spec(SPEED, 128) == SPEED and lib.spec(PLAIN_8BIT, 128) == PLAIN_8BIT.with_(p="mixed")
