"""The public op: validation sentences, backend accounting, one op per loaded package copy."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import dataclasses

from vc_attention.kernels import FIDELITY, PLAIN_8BIT, SPEED, VCConfig, api, backends


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
        api2._attention_op(q, q, q, None, None, "bhnd", "int8", "vsmooth", "exp2", True, 0, 128, False, 128, False, 0, None,
                           "reference", False, False)  # the registered op of the copy (eager calls of plain tensors skip it)
        assert api2.BACKEND_CALLS["reference"] == 2 and api.BACKEND_CALLS["reference"] == before
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
        assert backend.why_not(q, FIDELITY.without_refinements(), "bhnd") is None  # (a probe without refinements)
    assert len(calls) == 1


def test_one_call_selects_its_backend_once(monkeypatch):
    """The node selects (it must know the backend before running); the op then must not select again."""
    q = torch.randn(1, 1, 8, 64)
    chosen = backends.select(q, FIDELITY, "bhnd", "reference")
    selections = []
    real_select = backends.select_runnable  # (select itself goes through it)
    monkeypatch.setattr(backends, "select_runnable", lambda *a, **kw: selections.append(a) or real_select(*a, **kw))
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


def _perm(b, h, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g) for _ in range(b * h)]).view(b, h, n).to(torch.int32)


@pytest.mark.parametrize("bad", [-1, 100, 10**6])
def test_a_perm_value_out_of_range_is_refused(bad):
    """Out-of-range values raised a torch error on the CPU and index unchecked in the CUDA prepare kernel."""
    q = torch.randn(1, 2, 100, 64)
    perm = _perm(1, 2, 100)
    perm[0, 1, 7] = bad
    with pytest.raises(ValueError, match=r"perm values must lie in \[0, 100\)"):
        api.vc_attention(q, q, q, perm=perm, backend="reference")


def test_the_grouping_perm_is_trusted_without_a_host_sync(monkeypatch):
    """The node's path (perm_from_grouping=True) reads nothing back from the device per call."""
    from vc_attention.kernels import inputs

    def no_sync(*args, **kwargs):
        raise AssertionError("the trusted path must not reduce the perm (a host sync per call)")

    monkeypatch.setattr(inputs.torch, "aminmax", no_sync)
    q = torch.randn(1, 2, 100, 64)
    api.vc_attention(q, q, q, perm=_perm(1, 2, 100), perm_from_grouping=True, backend="reference")
    with pytest.raises(AssertionError, match="trusted path"):
        api.vc_attention(q, q, q, perm=_perm(1, 2, 100), backend="reference")


@pytest.mark.parametrize("broken", ["duplicate", "all_zero"])
def test_a_perm_that_is_not_a_permutation_is_refused(broken):
    """A repeated token gave a silently wrong output (rel-L2 0.08; an all-zero perm 8.3)."""
    q = torch.randn(1, 2, 100, 64)
    perm = _perm(1, 2, 100)
    if broken == "duplicate":
        perm[0, 0, 3] = perm[0, 0, 4]
    else:
        perm.zero_()
    with pytest.raises(ValueError, match="perm must be a permutation"):
        api.vc_attention(q, q, q, perm=perm, backend="reference")


def test_a_valid_perm_passes_and_a_float_perm_is_a_type_error():
    q = torch.randn(1, 2, 100, 64)
    perm = _perm(1, 2, 100)
    api.vc_attention(q, q, q, perm=perm.long(), backend="reference")
    with pytest.raises(TypeError, match="perm must be an int32 or int64 tensor"):
        api.vc_attention(q, q, q, perm=perm.float(), backend="reference")


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("empty_dim", [0, 1, 2])
def test_empty_shapes_give_an_empty_output(layout, empty_dim):
    """N = 0, B = 0 or H = 0 raised IndexError / RuntimeError."""
    shape = [2, 3, 50, 64]
    shape[empty_dim] = 0
    q = torch.randn(*shape, dtype=torch.bfloat16)
    b, h, n = (shape[0], shape[1], shape[2]) if layout == "bhnd" else (shape[0], shape[2], shape[1])
    out = api.vc_attention(q, q, q, layout=layout, perm=torch.zeros(b, h, n, dtype=torch.int32), backend="reference")
    assert out.shape == q.shape and out.dtype == q.dtype


def test_autograd_is_a_clear_error_and_no_grad_runs():
    q = torch.randn(1, 1, 64, 64, requires_grad=True)
    with pytest.raises(ValueError, match="no backward pass.*torch.no_grad"):
        api.vc_attention(q, q, q, backend="reference")
    with torch.no_grad():
        assert api.vc_attention(q, q, q, backend="reference").shape == q.shape


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool, torch.float8_e4m3fn])
def test_non_float_inputs_are_a_type_error(dtype):
    """int64 / int8 / bool inputs once ran and returned a truncated output (rel-L2 0.26)."""
    q = (torch.randn(1, 2, 64, 64) * 3).to(dtype)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        api.vc_attention(q, q, q, backend="reference")
    f = torch.randn(1, 2, 64, 64)
    with pytest.raises(TypeError, match="one dtype"):
        api.vc_attention(f, f, f.half(), backend="reference")


def test_config_and_rank_mistakes_are_sentences():
    q = torch.randn(1, 2, 64, 64)
    with pytest.raises(TypeError, match="config must be a VCConfig"):
        api.vc_attention(q, q, q, config=None)
    with pytest.raises(ValueError, match="4-D"):
        api.vc_attention(q[0], q[0], q[0])
    with pytest.raises(TypeError, match="q, k and v must be tensors"):
        api.vc_attention(q, q, q.numpy())


def test_the_checks_leave_the_op_traceable_in_one_graph():
    """The perm's values are checked inside the custom op (eager, real tensors), not while tracing."""
    q = torch.randn(1, 2, 128, 64)
    perm = _perm(1, 2, 128)
    compiled = torch.compile(lambda q, p: api.vc_attention(q, q, q, perm=p, backend="reference"), fullgraph=True)
    assert torch.equal(compiled(q, perm), api.vc_attention(q, q, q, perm=perm, backend="reference"))
    perm[0, 0, 0] = perm[0, 0, 1]
    with pytest.raises(ValueError, match="perm must be a permutation"):
        compiled(q, perm)


@pytest.mark.parametrize("through_the_op", [True, False], ids=["custom-op", "eager"])
@pytest.mark.parametrize("config", [FIDELITY, SPEED, PLAIN_8BIT, SPEED.with_(k_lane_scales=False, v_mean_merge=False, v_mean_rows=128, k_scale_rows=128, smooth_k=False),
                                    FIDELITY.with_(v_mean_rows=256).with_rank(2), SPEED.with_(v_mean_merge=False),
                                    FIDELITY.with_(k_lane_scales=True), FIDELITY.with_(p="mixed", v_lo_channels=16)])
def test_the_backend_runs_the_callers_config_field_for_field(config, through_the_op, monkeypatch):
    """The custom op carries the config as separate fields: each one must arrive (a field the op dropped
    ran its default silently: speed mode's v_mean_rows did, and ran the two-mean kernel). Both paths: the
    op (torch.compile, fake and meta tensors) and the eager call of plain tensors."""
    monkeypatch.setattr(api, "_through_the_op", lambda *tensors: through_the_op)
    seen = []
    backend = backends.get("reference")
    real_run = backend.run
    monkeypatch.setattr(backend, "run", lambda q, k, v, perm, cfg, *rest: seen.append(cfg) or real_run(q, k, v, perm, cfg, *rest))
    q = torch.randn(1, 1, 8, 64)
    api.vc_attention(q, q, q, config=config, backend="reference")
    assert seen == [config]
    assert {f.name for f in dataclasses.fields(VCConfig)} == {"qk", "v", "p", "smooth_k", "v_rank", "v_mean_rows",
                                                      "v_mean_merge", "k_scale_rows", "k_lane_scales", "v_lo_channels"}, \
        "a new VCConfig field: pass it through kernels/api._attention_op"


def test_eager_calls_of_plain_tensors_skip_the_custom_op_dispatch(monkeypatch):
    """The op's dispatch is host time a short call pays in full; eager calls run the same `_run` without it,
    with the same result and the same accounting (the op itself is exercised by the tests above)."""
    q = torch.randn(1, 2, 100, 64)
    expected = api.vc_attention(q, q, q, config=SPEED, backend="reference")

    def no_op(*args):
        raise AssertionError("the custom op was dispatched for an eager call of plain tensors")

    monkeypatch.setattr(api, "_attention_op", no_op)
    before = api.BACKEND_CALLS["reference"]
    assert torch.equal(api.vc_attention(q, q, q, config=SPEED, backend="reference"), expected)
    assert api.BACKEND_CALLS["reference"] == before + 1


def test_meta_tensors_and_tracing_go_through_the_op():
    """Shapes without data (meta tensors, as memory planners use) get the op's fake implementation; a
    plain tensor in eager mode does not take the op."""
    meta = torch.empty(1, 2, 100, 64, device="meta")
    out = api.vc_attention(meta, meta, meta, config=SPEED, backend="reference")
    assert out.is_meta and out.shape == meta.shape
    assert api._through_the_op(meta) and not api._through_the_op(torch.randn(1))
    assert api._through_the_op(torch.nn.Parameter(torch.randn(1)))  # a tensor subclass: the dispatcher's case
