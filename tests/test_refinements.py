"""Refinements (VCConfig.refinements_dropped): fidelity extras only some kernels have (the V residual's second term,
v_lo_channels; the mixed encoding, p="mixed"). A backend without one runs the call without it (backends.runnable_config)
instead of handing a preset that carries them to the slow emulation or to the model's attention; the op runs the
configuration its backend can take and counts what it dropped (api.REFINEMENTS_DROPPED)."""
import pytest
import torch

from vc_attention.kernels import api, backends
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED
from vc_attention.kernels.constants import SM90_V_LO_CHANNELS

# fidelity without its refinements (config.FIDELITY carries both since kernel-notes section 38): what a kernel without
# them runs
BASE = FIDELITY.with_(p="exp2", v_lo_channels=0)


def test_the_chain_drops_each_refinement_most_refined_first():
    both = BASE.with_(p="mixed", v_lo_channels=32)
    assert both.refinements_dropped() == (both, both.with_(v_lo_channels=0), BASE.with_(v_lo_channels=32), BASE)
    assert BASE.with_(v_lo_channels=16).refinements_dropped() == (BASE.with_(v_lo_channels=16), BASE)
    assert BASE.with_(p="mixed").refinements_dropped() == (BASE.with_(p="mixed"), BASE)
    for config in (BASE, SPEED, PLAIN_8BIT, both, SPEED.with_(v_lo_channels=32), BASE.with_(p="mixed")):
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
    both = BASE.with_(p="mixed", v_lo_channels=32)
    plain = registry(_backend("plain_stand_in", 990))
    with_lo = registry(_backend("lo_stand_in", 980, lo=(0, 32)))
    assert backends.runnable_config(plain, q, both, "bhnd") == BASE
    assert backends.runnable_config(with_lo, q, both, "bhnd") == BASE.with_(v_lo_channels=32)
    assert backends.runnable_config(backends.get("reference"), q, both, "bhnd") == both  # the spec has everything
    # a backend that cannot take even the base configuration (head dim) is not capable at all
    narrow = registry(_backend("narrow_stand_in", 970))
    narrow.constraints = backends.Constraints(device_type="any", head_dims=(128,))
    assert backends.runnable_config(narrow, q, both, "bhnd") is None
    with pytest.raises(backends.NoCapableBackend, match="narrow_stand_in.*head dim"):
        backends.select(q, both, "bhnd", "narrow_stand_in")
    # one that lacks the refinements too is refused for what stops its base configuration (v's rows, the check's last
    # clause), not for a refinement it would have dropped (the P encoding 'mixed', which its check of `both` meets first)
    narrow.constraints = backends.Constraints(device_type="any", aligned_rows=True, p_encodings=("exp2", "expcast"))
    misaligned = torch.zeros(1, 2, 64, 64).transpose(-1, -2)
    with pytest.raises(backends.NoCapableBackend, match="v needs a contiguous last dim") as refused:
        backends.select(q, both, "bhnd", "narrow_stand_in", kv=(q, misaligned))
    assert "mixed" not in str(refused.value)


def test_auto_keeps_a_fast_kernel_without_the_refinement_instead_of_the_emulation(registry):
    q = torch.zeros(1, 2, 64, 64)
    fast = registry(_backend("fast_stand_in", 990))
    # before refinements, a preset with the second term went to the emulation (the only backend declaring it)
    assert backends.select(q, BASE.with_(v_lo_channels=32), "bhnd", allow_slow=False) is fast
    assert backends.select(q, BASE.with_(p="mixed"), "bhnd") is fast


def test_the_op_runs_and_counts_the_configuration_its_backend_can_take(registry):
    seen = []
    registry(_backend("fast_stand_in", 990, seen=seen))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g) for _ in range(3))
    api.REFINEMENTS_DROPPED.clear()
    config = BASE.with_(v_lo_channels=32)
    api.vc_attention(q, k, v, config=config, perm=torch.arange(64).expand(1, 2, 64), backend="auto")
    assert seen == [BASE]  # the stand-in never saw a term it does not implement
    assert api.REFINEMENTS_DROPPED == {("fast_stand_in", BASE.tag): 1}
    api.vc_attention(q, k, v, config=BASE, perm=torch.arange(64).expand(1, 2, 64), backend="auto")
    assert seen == [BASE, BASE] and sum(api.REFINEMENTS_DROPPED.values()) == 1  # nothing dropped: not counted


def test_a_backend_passed_by_the_caller_also_runs_only_what_it_has(registry):
    seen = []
    chosen = registry(_backend("fast_stand_in", 990, seen=seen, lo=(0, 16)))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g) for _ in range(3))
    both = BASE.with_(p="mixed", v_lo_channels=16)
    # the node selects once, then passes the Backend it selected with the preset's configuration
    assert backends.select(q, both, "bhnd", "auto", allow_slow=False, kv=(k, v)) is chosen
    api.vc_attention(q, k, v, config=both, perm=torch.arange(64).expand(1, 2, 64), backend=chosen)
    assert seen == [BASE.with_(v_lo_channels=16)]


def test_a_backend_with_the_refinements_in_some_kernels_only_runs_them_there(registry):
    # the sm90 backend's rule (fidelity's paired-K exp2 loop at head dim 128) on a CPU stand-in with its constraints
    from dataclasses import replace

    from vc_attention.kernels import backend_sm90

    where = backend_sm90.refinements_where
    both = BASE.with_(p="mixed", v_lo_channels=SM90_V_LO_CHANNELS)
    assert where(128, both) is None and where(128, BASE.with_(p="mixed")) is None
    assert "head dim 128" in where(64, both)
    assert "exp2-family" in where(128, SPEED.with_(v_lo_channels=SM90_V_LO_CHANNELS))
    assert "K scales per 256 keys" in where(128, both.with_(k_scale_rows=128))
    assert "not per lane" in where(128, both.with_(k_lane_scales=True))
    declared = replace(backend_sm90.CONSTRAINTS, device_type="any", min_capability=None, max_capability=None,
                       dtypes=None, aligned_rows=False, jit_arch=None, needs_jit=False,
                       p_encodings=("exp2", "expcast", "mixed"), v_lo_channels=(0, SM90_V_LO_CHANNELS))
    stand_in = registry(_backend("sm90_rule_stand_in", 990))
    stand_in.constraints = declared
    q128, q64 = torch.zeros(1, 2, 64, 128), torch.zeros(1, 2, 64, 64)
    assert backends.runnable_config(stand_in, q128, both, "bhnd") == both
    # elsewhere each refinement is dropped where no kernel has it: at head dim 64 the second term (the mixed encoding
    # runs there on the ExpCast kernel: test_the_mixed_encoding_runs_on_the_expcast_kernel_where_a_step_is_one_tile)
    assert backends.runnable_config(stand_in, q64, both, "bhnd") == BASE.with_(p="mixed")
    assert backends.runnable_config(stand_in, q128, both.with_(k_scale_rows=128), "bhnd") == BASE.with_(k_scale_rows=128)
    reason = stand_in.why_not(q64, both, "bhnd")
    assert reason.startswith("this kernel runs the V residual's second term and the mixed encoding only at head dim 128")
    # a configuration without refinements never asks the rule (no host time on every call)
    stand_in.constraints = replace(declared, refinements_where=lambda d, c: pytest.fail("asked without refinements"))
    assert stand_in.why_not(q64, BASE, "bhnd") is None


def test_the_sm90_backend_declares_the_refined_kernels_only_once_measured():
    # REFINEMENTS_DECLARED (backend_sm90): until the GPU suite has run tests/test_sm90_refined_gpu.py, a call with
    # the refinements runs without them on the Hopper kernel
    from vc_attention.kernels import backend_sm90

    c = backend_sm90.CONSTRAINTS
    declared = backend_sm90.REFINEMENTS_DECLARED
    assert (SM90_V_LO_CHANNELS in c.v_lo_channels) == declared and ("mixed" in c.p_encodings) == declared
    assert c.refinements_where is backend_sm90.refinements_where


def test_the_fidelity_preset_carries_both_refinements_and_drops_to_the_base():
    assert FIDELITY.has_refinements and FIDELITY.p == "mixed" and FIDELITY.v_lo_channels == SM90_V_LO_CHANNELS == 30
    assert FIDELITY.refinements_dropped()[-1] == BASE and not BASE.has_refinements
    assert not SPEED.has_refinements and not PLAIN_8BIT.has_refinements


def test_without_refinements_is_the_chains_last():
    for config in (FIDELITY, BASE, SPEED, PLAIN_8BIT, BASE.with_(p="mixed"), BASE.with_(v_lo_channels=16)):
        assert config.without_refinements() == config.refinements_dropped()[-1]
        assert not config.without_refinements().has_refinements


def test_the_mixed_encoding_runs_on_the_expcast_kernel_where_a_step_is_one_tile():
    """With the chord for every key (MIXED_CHORD_EIGHTHS = 8) the spec's mixed encoding IS the speed encoding: the
    same codes for every score. So where fidelity's online softmax steps one 128-key tile (head dim 64 with V-Smooth)
    the sm90 backend runs p="mixed" on its ExpCast kernel with the configuration's own operands instead of dropping it;
    at head dim 128 with V-Smooth the refined paired-K kernel runs it (the binding's mixed flag)."""
    from vc_attention.kernels import backend_sm90, reference
    from vc_attention.kernels.constants import MIXED_CHORD_EIGHTHS

    assert MIXED_CHORD_EIGHTHS == 8
    g = torch.Generator().manual_seed(5)
    acc = torch.randint(-4000, 4000, (2, 3, 40, 640), generator=g).float()  # integer scores, as the INT8 MMA's
    scale = torch.rand(2, 3, 40, 1, generator=g) * 0.02 + 0.001
    for rows in (128, 256):
        mixed = reference.quantize_p(acc * scale, BASE.with_(p="mixed", k_scale_rows=rows), 128, acc=acc, scale=scale)
        speed = reference.quantize_p(acc * scale, BASE.with_(p="expcast", v_mean_rows=256, k_scale_rows=rows), 128,
                                     acc=acc, scale=scale)
        assert torch.equal(mixed, speed)
    mixed = BASE.with_(p="mixed")
    assert backend_sm90.kernel_expcast(64, mixed) and not backend_sm90.kernel_mixed(64, mixed)
    assert not backend_sm90.kernel_expcast(128, PLAIN_8BIT.with_(p="mixed"))  # (per-channel V: dropped to exp2)
    assert backend_sm90.refinements_where(128, PLAIN_8BIT.with_(p="mixed")) is not None
    assert backend_sm90.kernel_mixed(128, mixed) and not backend_sm90.kernel_expcast(128, mixed)
    assert not backend_sm90.kernel_expcast(64, BASE) and not backend_sm90.kernel_mixed(64, BASE)
    assert backend_sm90.refinements_where(64, mixed) is None
    assert "head dim 128" in backend_sm90.refinements_where(64, mixed.with_(v_lo_channels=32))
    # the V mode is the ExpCast kernel's for the same means (a mixed call with 256-row means at head dim 64 included)
    for rows in (128, 256):
        m = mixed.with_(v_mean_rows=rows)
        assert backend_sm90.vsmooth_mode(m, 64) == backend_sm90.vsmooth_mode(m.with_(p="expcast", k_scale_rows=128), 64)



def test_a_refined_call_checks_its_tensors_once_and_builds_its_chain_once(registry, monkeypatch):
    # host time (docs/kernel-notes.md section 44): the fidelity preset at head dim 64 drops its second V term on the
    # Hopper kernel; selecting it ran call_reason whole for each candidate and rebuilt the chain (four replace()
    # calls, each validating) on every attention call
    from vc_attention.kernels import backend_sm90

    stand_in = registry(_backend("host_time_stand_in", 991, lo=(0, SM90_V_LO_CHANNELS), p_encodings=("exp2", "expcast", "mixed")))
    stand_in.constraints = backends.Constraints(device_type="any", aligned_rows=True, v_lo_channels=(0, SM90_V_LO_CHANNELS),
                                                p_encodings=("exp2", "expcast", "mixed"),
                                                refinements_where=backend_sm90.refinements_where)
    asked = {"device": 0, "alignment": 0}
    for what, name in (("device", "_device_reason"), ("alignment", "_alignment_reason")):
        def counted(*args, _real=getattr(backends, name), _what=what):
            asked[_what] += 1
            return _real(*args)
        monkeypatch.setattr(backends, name, counted)
    q64 = torch.zeros(1, 2, 64, 64)
    chain = FIDELITY.refinements_dropped()
    assert backends.runnable_config(stand_in, q64, FIDELITY, "bhnd", q64, q64) == chain[1]  # the second term dropped
    assert asked == {"device": 1, "alignment": 1}
    # the same configuration objects on every call (nothing rebuilt), the caller's own first
    again = FIDELITY.refinements_dropped()
    assert all(a is b for a, b in zip(chain[1:], again[1:])) and again[0] is FIDELITY
    assert FIDELITY.without_refinements() is chain[-1]
    # misaligned rows still refuse every candidate, with the alignment's sentence
    odd = torch.zeros(1, 2, 64, 65)[..., :64]
    assert backends.runnable_config(stand_in, odd, FIDELITY, "bhnd") is None
    assert stand_in.why_not(odd, FIDELITY.without_refinements(), "bhnd") == "q needs a contiguous last dim and 16-byte aligned rows"
