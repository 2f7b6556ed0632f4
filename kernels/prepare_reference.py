"""The prepare step computed with reference.py's quantizers: the defining values of the operand
contract (kernels/operands.py). Any device, float32 math; CPU-testable."""
from __future__ import annotations

from typing import Optional

import torch

from . import reference
from .config import VCConfig
from .layout import to_bhnd
from .operands import N_ALIGN, PreparedOperands, low_rows, padded_length


def _pad_to_length(x: torch.Tensor, n_pad: int) -> torch.Tensor:
    """Zero rows appended along dim -2 up to n_pad rows (the kernels' N_ALIGN-padded length)."""
    return torch.nn.functional.pad(x, (0, 0, 0, n_pad - x.shape[-2]))


def _qk_storage(values: torch.Tensor, config: VCConfig) -> torch.Tensor:
    return values if config.qk == "int8" else values.to(torch.float8_e4m3fn)


def prepare_reference(q, k, v, perm: Optional[torch.Tensor], config: VCConfig, layout: str = "bhnd",
                      sm_scale: Optional[float] = None, basis: Optional[torch.Tensor] = None) -> PreparedOperands:
    """The operand contract computed with reference.py (any device; float32 math). basis: the low-rank
    term's W (B,H,config.v_rank,D) fp16; None: reference.lowrank_basis's (config.v_rank > 0)."""
    qb, kb, vb = (to_bhnd(t, layout) for t in (q, k, v))
    if perm is not None:
        kb, vb = reference.permute_tokens(kb, perm.long()), reference.permute_tokens(vb, perm.long())
    kb, vb = reference.lane_sorted(kb, vb, config)
    n = qb.shape[2]
    n_pad = padded_length(n)
    q_q, q_scale, k_q, k_scale = reference.quantize_qk(qb, kb, config, sm_scale)
    low = {}
    if config.v == "vsmooth":
        basis = reference.resolve_basis(vb, config.v_rank, basis)
        vs = reference.quantize_v_vsmooth(vb, basis, config.v_mean_rows, reference.merges(config, vb.shape[-1]),
                                          config.v_lo_channels)
        if vs.seg_end is not None:
            low["v_seg_end"] = vs.seg_end
        if vs.lo_q is not None:
            low["v_lo_t"] = _pad_to_length(vs.lo_q, n_pad).transpose(-1, -2).contiguous().to(torch.float8_e4m3fn)
            low["v_lo_sel"] = vs.lo_sel.to(torch.int32).contiguous()
        resid, scale, mean = vs.residual_q, vs.scale, vs.mean
        if basis is not None:
            low = dict(v_low_t=low_rows(vs.coeff_q, n_pad),
                       v_low_scale=vs.coeff_scale.squeeze(-2).contiguous(), v_low_basis=basis.contiguous())
    else:
        resid, scale = reference.quantize_fp8_per_channel(vb)
        b, h, _, d = vb.shape
        mean = torch.zeros(b, h, n_pad // N_ALIGN, d, dtype=torch.float16, device=vb.device)
    v_t = _pad_to_length(resid, n_pad).transpose(-1, -2).contiguous().to(torch.float8_e4m3fn)
    scale = scale.squeeze(-2)
    return PreparedOperands(
        q_q=_qk_storage(_pad_to_length(q_q, n_pad), config).contiguous(),
        q_scale=torch.nn.functional.pad(q_scale, (0, n_pad - n)).contiguous(),
        k_q=_qk_storage(_pad_to_length(k_q, n_pad), config).contiguous(),
        k_scale=k_scale.contiguous(),
        v_t=v_t,
        v_scale=torch.where(scale > 0, scale, torch.ones_like(scale)).contiguous(),
        v_mean=mean.contiguous(),
        n_tokens=n,
        **low,
    )
