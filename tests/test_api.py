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


def test_backend_availability_is_checked_once_not_per_call(monkeypatch):
    """Availability can spawn `nvcc --version`: asking it per attention call cost ms per call."""
    calls = []
    monkeypatch.setattr(backends, "availability_reason", lambda c: calls.append(c) and None)
    backend = backends.Backend(name="probe", priority=-1, run=lambda *a: None,
                               constraints=backends.Constraints(device_type="any"))
    q = torch.randn(1, 1, 4, 64)
    for _ in range(5):
        assert backend.why_not(q, FIDELITY, "bhnd") is None
    assert len(calls) == 1


def test_one_call_selects_its_backend_once(monkeypatch):
    """The node selects (it must know the backend before running); the op then must not select again."""
    q = torch.randn(1, 1, 8, 64)
    chosen = backends.select(q, FIDELITY, "bhnd", "reference")
    selections = []
    real_select = backends.select
    monkeypatch.setattr(backends, "select", lambda *a, **kw: selections.append(a) or real_select(*a, **kw))
    api.vc_attention(q, q, q, backend=chosen)
    assert selections == []
    api.vc_attention(q, q, q, backend="reference")
    assert len(selections) == 1


def test_prepare_is_its_own_extension_and_imports_no_backend():
    """Every CUDA backend runs the prepare extension; none builds another backend's kernels for it."""
    import subprocess

    script = ("import sys; import vc_attention.kernels.prepared_run; "
              "print(sorted(m for m in sys.modules if m.startswith('vc_attention.kernels.backend')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    from vc_attention.kernels import backend_mma, backend_sm90, prepare_cuda

    assert "prepare.cu" in prepare_cuda.SOURCES
    assert "prepare.cu" not in backend_mma.SOURCES and "prepare.cu" not in backend_sm90.SOURCES
    assert not set(backend_mma.SOURCES) & set(backend_sm90.SOURCES)
