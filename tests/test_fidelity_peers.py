"""SageAttention rows of `vc-attention fidelity`: a fake `sageattention` module proves on the CPU that
the rows appear, come from its output, and that a failing entry point is reported, not fatal."""
import json
import math
import sys
import types

import pytest
import torch

from vc_attention import cli
from vc_attention.commands import fidelity_peers
from vc_attention.study import fidelity as fi

TINY = ["--frames", "1", "--height", "8", "--width", "16", "--heads", "1", "--clusters", "2"]


def _attention(q, k, v):
    p = torch.softmax(q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ v.double()


@pytest.fixture
def fake_sage(monkeypatch):
    """sageattention 9.9 whose sageattn returns 1.5x the attention of its own inputs and whose CUDA
    entry point returns 0.8x; both record the inputs they were given."""
    calls = []

    def entry(factor):
        def fn(q, k, v, tensor_layout="HND", is_causal=False):
            calls.append((fn.__name__, q.dtype, tensor_layout, is_causal, tuple(q.shape)))
            return (factor * _attention(q, k, v)).to(q.dtype)
        return fn

    module = types.ModuleType("sageattention")
    module.__version__ = "9.9"
    module.sageattn = entry(1.5)
    module.sageattn.__name__ = "sageattn"
    module.sageattn_qk_int8_pv_fp8_cuda = entry(0.8)
    module.sageattn_qk_int8_pv_fp8_cuda.__name__ = "sageattn_qk_int8_pv_fp8_cuda"
    monkeypatch.setitem(sys.modules, "sageattention", module)
    monkeypatch.setattr(fidelity_peers, "_on_gpu", lambda q: True)  # the command runs them on GPUs only
    return module, calls


def test_rows_appear_and_come_from_its_output(fake_sage, capsys):
    _, calls = fake_sage
    assert cli.main(["fidelity", *TINY, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in result["rows"]}
    assert [r["method"] for r in result["rows"]][: len(fi.METHODS)] == list(fi.METHODS)
    sage = rows["SageAttention 9.9 sageattn (GPU run)"]
    cuda = rows["SageAttention 9.9 sageattn_qk_int8_pv_fp8_cuda (GPU run)"]
    # 1.5x and 0.8x the attention of bf16-rounded inputs: rel-L2 0.5 and 0.2 up to that rounding
    assert sage["rel_l2"] == pytest.approx(0.5, abs=0.02) and cuda["rel_l2"] == pytest.approx(0.2, abs=0.02)
    assert sage["tv_mean"] is None and sage["qk_term"] is None  # a black box has no P
    assert [c[:4] for c in calls] == [("sageattn", torch.bfloat16, "HND", False),
                                      ("sageattn_qk_int8_pv_fp8_cuda", torch.bfloat16, "HND", False)]
    assert calls[0][4] == (1, 1, 128, 128)


def test_table_shows_dashes_for_figures_a_black_box_lacks(fake_sage, capsys):
    assert cli.main(["fidelity", *TINY]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("| SageAttention 9.9 sageattn (GPU run)"))
    assert line.endswith("| - / - | - | - |")


def test_a_failing_entry_point_is_reported_and_the_rest_still_runs(fake_sage, capsys):
    module, _ = fake_sage

    def unsupported(q, k, v, tensor_layout="HND", is_causal=False):
        raise AssertionError("head dim not supported")

    module.sageattn_qk_int8_pv_fp8_cuda = unsupported
    assert cli.main(["fidelity", *TINY, "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    methods = [r["method"] for r in result["rows"]]
    assert "SageAttention 9.9 sageattn (GPU run)" in methods
    assert not any("qk_int8_pv_fp8_cuda" in m for m in methods)
    assert any("sageattn_qk_int8_pv_fp8_cuda failed: AssertionError: head dim not supported" in n for n in result["notes"])
    assert "head dim not supported" in captured.err


def test_no_rows_without_the_module_or_off_the_gpu(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sageattention", None)  # import raises ImportError
    assert cli.main(["fidelity", *TINY, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in result["rows"]] == list(fi.METHODS)
    expected = "not on a CUDA GPU" if not torch.cuda.is_available() else "not installed"
    assert any(expected in n for n in result["notes"])
