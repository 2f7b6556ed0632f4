"""Shared pytest fixtures and hooks."""
import os
import sys
from pathlib import Path

import pytest

COMFY_STANDIN = Path(__file__).resolve().parent / "comfy_standin"


@pytest.fixture(scope="session")
def comfy_standin():
    """Put the documented stand-in of ComfyUI's API (tests/comfy_standin/README.md) on sys.path.

    Tests that drive the nodes request this fixture; everything else never sees a `comfy` module.
    """
    sys.path.insert(0, str(COMFY_STANDIN))
    yield COMFY_STANDIN
    sys.path.remove(str(COMFY_STANDIN))


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's test command): one worker per core this process may use, at most four where a CUDA
    device is visible: the GPU tests of every worker share the one device (four is what bench/device_run.sh runs the
    GPU tier with; under eight, one worker's later GPU tests failed together, docs/kernel-notes.md 49-50)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    import torch

    return min(cores, 4) if torch.cuda.is_available() else cores


@pytest.fixture(autouse=True)
def fresh_node_baselines():
    """Every test starts with no model-attention baseline remembered from another test's run (the node
    keeps them for the process: nodes/stats.py); tests of the reuse make their runs themselves."""
    stats = sys.modules.get("vc_attention.nodes.stats")
    if stats is not None:
        stats.forget_baselines()
    yield


def _sm90_kernel_flags(kernel_name: str) -> tuple[bool, bool, bool, bool]:
    """(LOWRANK, STEPMEAN, KPAIR, KLANES), the last four template arguments of an sm90 kernel name as the profiler
    gives it, demangled ("...kernel<128, true, true, __nv_bfloat16, 4, false, true, false, false>(...)") or mangled
    ("...Li4ELb0ELb1ELb0ELb0EEEv...")."""
    import re

    demangled = re.search(r"vc_attention_sm90_kernel<[^>]*?, (true|false), (true|false), (true|false), (true|false)>",
                          kernel_name)
    if demangled:
        return tuple(group == "true" for group in demangled.groups())
    mangled = re.search(r"vc_attention_sm90_kernelI.*?Li\d+ELb([01])ELb([01])ELb([01])ELb([01])EE", kernel_name)
    assert mangled, kernel_name
    return tuple(group == "1" for group in mangled.groups())


@pytest.fixture(scope="session")
def sm90_kernel_flags():
    """The parser of an sm90 kernel's (LOWRANK, STEPMEAN, KPAIR, KLANES) template flags from its profiler name."""
    return _sm90_kernel_flags
