"""The fp16 PV-partial emulation (bench/pv_accum_study.py) is faithful and says what it claims.

- Its fp32 path with 128-key steps IS the reference (reference.quantize_p, p @ Vhat / sum p).
- fp16 partials with V codes as stored overflow (one product can exceed 65504).
- With V codes re-quantized at 2^-8 they stay finite and close to the fp32 path.
"""
import importlib.util
from pathlib import Path

import pytest
import torch

from vc_attention.kernels import reference as ref
from vc_attention.kernels.config import FIDELITY, SPEED


def study_fidelity():
    """bench/pv_accum_study.py's fidelity: the preset without its refinements (exp2 P, the portable kernel's)."""
    return FIDELITY.without_refinements()

STUDY_PATH = Path(__file__).resolve().parent.parent / "bench" / "pv_accum_study.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("pv_accum_study", STUDY_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def case(study):
    torch.manual_seed(0)
    return study.video_case(1024, heads=1, rows=48, seed=0)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("config", [study_fidelity(), SPEED])
def test_fp32_path_is_the_reference(study, case, config):
    vs = case["vsmooth"]
    p = ref.quantize_p(case["scores"], config)
    want = p @ vs.dequantized().double() / p.sum(-1, keepdim=True)
    got = study.pv_output(case["scores"], vs, config, "fp32", step=ref.K_BLOCK)
    assert _rel(got, want) < 1e-5


def test_fp16_partials_overflow_without_rescaled_v(study, case):
    out = study.pv_output(case["scores"], case["vsmooth"], study_fidelity(), "fp16")
    assert not bool(torch.isfinite(out).all())


@pytest.mark.parametrize("config", [study_fidelity(), SPEED])
def test_fp16_partials_with_rescaled_v_stay_close(study, case, config):
    base = study.pv_output(case["scores"], case["vsmooth"], config, "fp32")
    out = study.pv_output(case["scores"], case["vsmooth"], config, "fp16-v/256")
    assert bool(torch.isfinite(out).all())
    assert 0 < _rel(out, base) < 2e-3  # not bit-equal (the fp16 rounding is there), but small


def test_rejects_unknown_accumulation(study, case):
    with pytest.raises(ValueError, match="accumulation must be one of"):
        study.pv_output(case["scores"], case["vsmooth"], study_fidelity(), "bf16")
