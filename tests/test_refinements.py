"""Refinements (VCConfig.refinements_dropped): fidelity extras only some kernels have (the V residual's second term,
v_lo_channels; the mixed encoding, p="mixed"). A backend without one runs the call without it (backends.runnable_config)
instead of handing a preset that carries them to the slow emulation or to the model's attention; the op runs the
configuration its backend can take and counts what it dropped (api.REFINEMENTS_DROPPED)."""
import pytest
import torch

from vc_attention.kernels import api, backends
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED


def test_the_chain_drops_each_refinement_most_refined_first():
    both = FIDELITY.with_(p="mixed", v_lo_channels=32)
    assert both.refinements_dropped() == (both, both.with_(v_lo_channels=0), FIDELITY.with_(v_lo_channels=32), FIDELITY)
    assert FIDELITY.with_(v_lo_channels=16).refinements_dropped() == (FIDELITY.with_(v_lo_channels=16), FIDELITY)
    assert FIDELITY.with_(p="mixed").refinements_dropped() == (FIDELITY.with_(p="mixed"), FIDELITY)
    for config in (FIDELITY, SPEED, PLAIN_8BIT, both, SPEED.with_(v_lo_channels=32), FIDELITY.with_(p="mixed")):
        assert config.has_refinements == (len(config.refinements_dropped()) > 1), config.tag
        assert config.refinements_dropped()[0] == config


def _backend(name, priority, *, lo=(0,), p_encodings=("exp2", "expcast"), seen=None, slow=False):
    """A CPU stand-in that records the configuration each call ran."""
    def run(q, k, v, perm, config, layout, sm_scale):
        if seen is not None:
            seen.append(config)
        return torch.zeros_like(q)
    return backends.Backend(name=name, priority=priority, slow=slow, run=run,
                            constraints=backends.Constraints(device_type="any", v_lo_channels=lo, p_encodings=p_encodings))


@pytest.fixture
def registry(monkeypatch):
    backends.backends()  # the built-in ones first, so that the stand-ins are added to a loaded registry

    def add(backend):
        monkeypatch.setitem(backends._REGISTRY, backend.name, backend)
        return backend
    return add


def test_a_backend_runs_the_most_refined_configuration_it_has(registry):
    q = torch.zeros(1, 2, 64, 64)
    both = FIDELITY.with_(p="mixed", v_lo_channels=32)
    plain = registry(_backend("plain_stand_in", 990))
    with_lo = registry(_backend("lo_stand_in", 980, lo=(0, 32)))
    assert backends.runnable_config(plain, q, both, "bhnd") == FIDELITY
    assert backends.runnable_config(with_lo, q, both, "bhnd") == FIDELITY.with_(v_lo_channels=32)
    assert backends.runnable_config(backends.get("reference"), q, both, "bhnd") == both  # the spec has everything
    # a backend that cannot take even the base configuration (head dim) is not capable at all
    narrow = registry(_backend("narrow_stand_in", 970))
    narrow.constraints = backends.Constraints(device_type="any", head_dims=(128,))
    assert backends.runnable_config(narrow, q, both, "bhnd") is None
    with pytest.raises(backends.NoCapableBackend, match="narrow_stand_in.*head dim"):
        backends.select(q, both, "bhnd", "narrow_stand_in")


def test_auto_keeps_a_fast_kernel_without_the_refinement_instead_of_the_emulation(registry):
    q = torch.zeros(1, 2, 64, 64)
    fast = registry(_backend("fast_stand_in", 990))
    # before refinements, a preset with the second term went to the emulation (the only backend declaring it)
    assert backends.select(q, FIDELITY.with_(v_lo_channels=32), "bhnd", allow_slow=False) is fast
    assert backends.select(q, FIDELITY.with_(p="mixed"), "bhnd") is fast


def test_the_op_runs_and_counts_the_configuration_its_backend_can_take(registry):
    seen = []
    registry(_backend("fast_stand_in", 990, seen=seen))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g) for _ in range(3))
    api.REFINEMENTS_DROPPED.clear()
    config = FIDELITY.with_(v_lo_channels=32)
    api.vc_attention(q, k, v, config=config, perm=torch.arange(64).expand(1, 2, 64), backend="auto")
    assert seen == [FIDELITY]  # the stand-in never saw a term it does not implement
    assert api.REFINEMENTS_DROPPED == {("fast_stand_in", FIDELITY.tag): 1}
    api.vc_attention(q, k, v, config=FIDELITY, perm=torch.arange(64).expand(1, 2, 64), backend="auto")
    assert seen == [FIDELITY, FIDELITY] and sum(api.REFINEMENTS_DROPPED.values()) == 1  # nothing dropped: not counted


def test_a_backend_passed_by_the_caller_also_runs_only_what_it_has(registry):
    seen = []
    chosen = registry(_backend("fast_stand_in", 990, seen=seen, lo=(0, 16)))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g) for _ in range(3))
    both = FIDELITY.with_(p="mixed", v_lo_channels=16)
    # the node selects once, then passes the Backend it selected with the preset's configuration
    assert backends.select(q, both, "bhnd", "auto", allow_slow=False, kv=(k, v)) is chosen
    api.vc_attention(q, k, v, config=both, perm=torch.arange(64).expand(1, 2, 64), backend=chosen)
    assert seen == [FIDELITY.with_(v_lo_channels=16)]
