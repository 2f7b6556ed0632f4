"""The public op: validation sentences, backend accounting, one op per loaded package copy."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from vc_attention.kernels import FIDELITY, api, backends


def test_reference_call_is_counted_and_matches_the_emulation():
    q = torch.randn(1, 2, 100, 64)
    before = api.BACKEND_CALLS["reference"]
    out = api.vc_attention(q, q, q, config=FIDELITY, backend="reference")
    assert api.BACKEND_CALLS["reference"] == before + 1
    from vc_attention.kernels.reference import vc_attention_reference

    assert torch.equal(out, vc_attention_reference(q, q, q, FIDELITY))


def test_bad_inputs_raise_sentences():
    q = torch.randn(1, 2, 10, 64)
    with pytest.raises(ValueError, match="same shape"):
        api.vc_attention(q, q[:, :, :5], q[:, :, :5])
    with pytest.raises(ValueError, match="layout"):
        api.vc_attention(q, q, q, layout="nhd")
    with pytest.raises(ValueError, match="perm must have shape"):
        api.vc_attention(q, q, q, perm=torch.zeros(1, 2, 9, dtype=torch.int32))
    with pytest.raises(ValueError, match="unknown VC-Attention backend"):
        backends.get("nope")


def test_a_second_copy_of_the_package_gets_its_own_op(tmp_path):
    """ComfyUI loads the pack by folder name while pip provides vc_attention: both must work."""
    root = Path(api.__file__).resolve().parents[1]
    copy = tmp_path / "ComfyUI-VC-Attention"
    copy.symlink_to(root, target_is_directory=True)
    spec = importlib.util.spec_from_file_location("ComfyUI_VC_Attention_copy", copy / "__init__.py",
                                                  submodule_search_locations=[str(copy)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pkg
    try:
        spec.loader.exec_module(pkg)
        api2 = importlib.import_module(f"{spec.name}.kernels.api")
        assert api2.OP_NAME != api.OP_NAME
        q = torch.randn(1, 1, 20, 64)
        before = api.BACKEND_CALLS["reference"]
        api2.vc_attention(q, q, q, backend="reference")
        assert api2.BACKEND_CALLS["reference"] == 1 and api.BACKEND_CALLS["reference"] == before
    finally:
        for name in [n for n in sys.modules if n.startswith(spec.name)]:
            del sys.modules[name]


def test_backend_availability_is_checked_once_not_per_call():
    """Availability can spawn `nvcc --version`: asking it per attention call cost ms per call."""
    calls = []

    def available():
        calls.append(1)
        return None

    backend = backends.Backend(name="probe", priority=-1, run=lambda *a: None,
                               unsupported_reason=lambda q, c, l: None, available_reason=available)
    q = torch.randn(1, 1, 4, 64)
    for _ in range(5):
        assert backend.why_not(q, FIDELITY, "bhnd") is None
    assert len(calls) == 1
