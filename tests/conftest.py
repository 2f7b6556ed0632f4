"""Shared pytest fixtures."""
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


@pytest.fixture(autouse=True)
def fresh_node_baselines():
    """Every test starts with no model-attention baseline remembered from another test's run (the node
    keeps them for the process: nodes/stats.py); tests of the reuse make their runs themselves."""
    stats = sys.modules.get("vc_attention.nodes.stats")
    if stats is not None:
        stats.forget_baselines()
    yield
