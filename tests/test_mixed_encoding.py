"""The mixed P encoding (reference p="mixed"): exp2 + cast for the first keys of every online-softmax step, the ExpCast
chord for its last eighths, both at row max 448 (docs/fidelity-study.md "The mixed encoding"; the Hopper variant
VC_SM90_EXP2_CHORD_EIGHTHS implements it, tests/test_mixed_encoding_sass.py checks its machine code)."""
import math

import pytest
import torch

from vc_attention.kernels import backends, constants
from vc_attention.kernels import reference as R
from vc_attention.kernels.config import FIDELITY, VCConfig


def scores(seed=0, rows=6, keys=700):
    """Integer INT8-style scores and a per-row scale whose rows rise and fall (the running max moves)."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.randint(-4000, 4000, (1, 2, rows, keys), generator=g, dtype=torch.int32)
    acc[..., 300:340] += 3000  # a later block with a larger max: the running offset moves mid-row
    scale = torch.rand(1, 2, rows, 1, generator=g) * 0.004 + 0.001
    return acc, scale, acc * scale


@pytest.mark.parametrize("step,eighths,first", [(256, 4, 128), (256, 2, 192), (256, 8, 0), (256, 0, 256),
                                                (128, 4, 64), (128, 2, 96), (64, 4, 32)])
def test_the_chord_takes_the_last_eighths_of_every_step(step, eighths, first):
    n = 3 * step + 37  # a partial last step keeps the rule by its keys' positions
    chord = R.mixed_chord_keys(n, step, eighths)
    pos = torch.arange(n) % step
    assert torch.equal(chord, pos >= first)
    assert int(chord[:step].sum()) == step * eighths // 8


@pytest.mark.parametrize("eighths", [-1, 9])
def test_a_share_outside_zero_to_eight_eighths_is_refused(eighths):
    with pytest.raises(ValueError, match="chord_eighths"):
        R.mixed_chord_keys(256, 256, eighths)


def test_a_share_that_is_not_whole_keys_is_refused():
    with pytest.raises(ValueError, match="multiple of 8"):
        R.mixed_chord_keys(100, 4, 3)  # 4 keys per step: 3 eighths is 1.5 keys


@pytest.mark.parametrize("step", [128, 256])
def test_mixed_is_the_chord_on_chord_keys_and_exp2_at_448_elsewhere(step):
    acc, scale, s = scores()
    # half and half (the product's split is 8/8, constants.MIXED_CHORD_EIGHTHS: the dial's end, checked below)
    mixed = R.quantize_p(s, VCConfig(p="mixed"), step, acc=acc, scale=scale, chord_eighths=4)
    chord = R.quantize_p(s, VCConfig(p="expcast"), step, acc=acc, scale=scale)
    # exp2 at 448 against the same running offsets, rescaled to the final one as quantize_p does
    run = R.running_row_offsets(s, step)
    m_run = run.repeat_interleave(step, dim=-1)[..., : s.shape[-1]]
    exp2_448 = R.p_exp2_cast_448(s, m_run).double() * torch.exp2(m_run.double() - run[..., -1:].double())
    keys = R.mixed_chord_keys(s.shape[-1], step, 4)
    assert keys.any() and (~keys).any()
    assert torch.equal(mixed[..., keys], chord[..., keys])
    assert torch.equal(mixed[..., ~keys], exp2_448[..., ~keys])
    # both ends of the dial: all chord is the speed encoding, no chord is exp2 at 448
    assert torch.equal(R.quantize_p(s, VCConfig(p="mixed"), step, acc=acc, scale=scale, chord_eighths=8), chord)
    assert torch.equal(R.quantize_p(s, VCConfig(p="mixed"), step, acc=acc, scale=scale, chord_eighths=0), exp2_448)


def test_the_exp2_keys_put_the_row_max_at_448_as_the_chord_does():
    u = torch.tensor([0.0, -1.0, -0.5, -20.0])
    p = R.p_exp2_cast_448(u)
    assert p[0].item() == 448.0 == R.p_expcast(torch.zeros(1)).item()  # both kinds' top code is 126
    assert p[1].item() == 224.0
    assert p[3].item() == 0.0  # 448 * 2^-20 is below half of E4M3's smallest subnormal 2^-9
    assert p[2].item() == R.fp8_e4m3(torch.tensor(448.0 / math.sqrt(2.0))).item()
    assert constants.MIXED_P_LOG2_MAX == math.log2(448.0)


def test_exp2_keys_are_monotone_in_the_score():
    u = torch.linspace(-22.0, 0.0, 20001)
    p = R.p_exp2_cast_448(u)
    assert bool((p[1:] >= p[:-1]).all())


def test_the_configuration_takes_mixed_where_it_takes_exp2():
    assert VCConfig(p="mixed", k_scale_rows=256).k_scale_rows == 256  # paired K scales with 128-row means, as exp2
    assert VCConfig(p="mixed", k_scale_rows=256).tag == "int8-vsmooth-mixed-k256"
    assert FIDELITY.tag == "int8-vsmooth-mixed-k256-lo30"  # the preset since kernel-notes section 38
    with pytest.raises(ValueError, match="p must be one of"):
        VCConfig(p="mix")


def test_the_hopper_kernel_claims_mixed_and_the_portable_one_does_not():
    # sm90's refined fidelity kernels (launch_refined, measured in kernel-notes section 38); the portable kernel's chord
    # saved nothing on sm_89 (section 36): it runs the call as exp2 (a refinement)
    from vc_attention.kernels import backend_sm90

    assert ("mixed" in backends.get("sm90").constraints.p_encodings) == backend_sm90.REFINEMENTS_DECLARED
    assert "mixed" not in backends.get("mma").constraints.p_encodings
    assert "mixed" in backends.get("reference").constraints.p_encodings
    assert constants.MIXED_CHORD_EIGHTHS == 8  # the adopted split: the chord for every key


def test_the_reference_backend_runs_mixed_end_to_end():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    config = FIDELITY.with_(p="mixed", k_scale_rows=128)
    out = R.vc_attention_reference(q, k, v, config, perm=torch.stack([torch.randperm(300, generator=g) for _ in range(2)])[None])
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8.0, -1) @ v.double()
    err = ((out.double() - exact).norm() / exact.norm()).item()
    assert 0.0 < err < 0.05


def test_the_study_tool_sweeps_the_share_against_the_same_case():
    # bench/mixed_encoding_study.py (docs/fidelity-study.md "The mixed encoding"): one small case, every row measured
    from vc_attention.bench import fidelity_study, mixed_encoding_study

    case = fidelity_study.make_case("video", 4096, 1, 32, 0, fidelity_study.Grouping(32, 1, "chain"))
    rows = mixed_encoding_study.case_rows(case)
    assert len(rows) == 1 + len(mixed_encoding_study.SHARES)
    assert all(0.0 < err < 0.1 for err in rows.values()), rows
    errs = list(rows.values())
    assert errs[1] != errs[-1]  # exp2 at 448 and the all-chord row are different encodings of the same scores
