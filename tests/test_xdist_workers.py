"""`-n auto` in the README's test command: tests/conftest.py's worker count (one per usable core, at most four
where a GPU is visible)."""
import os

import pytest
import torch

pytest.importorskip("xdist")


@pytest.mark.parametrize("gpu, cores, workers", [(False, 2, 2), (False, 16, 16), (True, 2, 2), (True, 16, 4)])
def test_auto_workers_are_the_cores_capped_at_four_beside_a_gpu(pytestconfig, monkeypatch, gpu, cores, workers):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert pytestconfig.hook.pytest_xdist_auto_num_workers(config=pytestconfig) == workers
