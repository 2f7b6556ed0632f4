"""The `reference` backend: the bit-exact emulation (CPU or GPU). Slow; tests and CPU demos only."""
from __future__ import annotations

from . import reference
from .backends import Backend, Constraints, register
from .config import MAX_V_RANK, V_LO_CHANNELS, VCConfig

# the emulation takes any device, dtype, head dim, configuration and strides
CONSTRAINTS = Constraints(device_type="any", max_v_rank=MAX_V_RANK, k_lane_scales=True, v_lo_channels=V_LO_CHANNELS)


def _run(q, k, v, perm, config: VCConfig, layout: str, sm_scale, v_basis=None):
    return reference.vc_attention_reference(q, k, v, config, layout=layout, perm=perm, sm_scale=sm_scale, v_basis=v_basis)


register(Backend(name="reference", priority=0, constraints=CONSTRAINTS, run=_run, slow=True))
