"""The library's backend "auto" never swaps a kernel for the slow emulation silently off the CPU."""
import warnings

import pytest
import torch

from vc_attention.kernels import FIDELITY, api


def _auto_call(q):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        api.vc_attention(q, q, q, config=FIDELITY)
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and "VC-Attention" in str(w.message)]


def test_auto_on_the_cpu_runs_the_emulation_quietly_the_documented_path():
    before = api.BACKEND_CALLS["reference"]
    assert _auto_call(torch.randn(1, 1, 40, 64)) == []
    assert api.BACKEND_CALLS["reference"] == before + 1


def test_auto_elsewhere_warns_once_with_the_reasons_and_counts(monkeypatch):
    # as if this CPU were a GPU without a usable kernel: what a user of an unsupported GPU sees
    monkeypatch.setattr(api, "SILENT_EMULATION_DEVICES", ())
    monkeypatch.setattr(api, "_announced", set())
    before = api.BACKEND_CALLS["reference"]
    q = torch.randn(1, 1, 40, 64)
    (first,) = _auto_call(q)
    assert _auto_call(q) == []  # once per distinct set of reasons, not per call
    message = str(first.message)
    assert "sm90: " in message and "mma: " in message and "backend='reference'" in message
    assert api.BACKEND_CALLS["reference"] == before + 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_on_a_gpu_with_an_unsupported_head_dim_warns_before_emulating(monkeypatch):
    monkeypatch.setattr(api, "_announced", set())
    q = torch.randn(1, 2, 256, 96, device="cuda", dtype=torch.bfloat16)  # head dim 96: no kernel takes it
    before = api.BACKEND_CALLS["reference"]
    (warning,) = _auto_call(q)
    assert "head dim 96" in str(warning.message)
    assert api.BACKEND_CALLS["reference"] == before + 1
