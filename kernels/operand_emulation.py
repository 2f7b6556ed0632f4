"""What an attention kernel computes from prepared operands, emulated in float64 (tests and docs).

It reads only the operand contract (kernels/operands.py), so a test can feed it what the CUDA
prepare produced and separate a prepare error from an attention-kernel error.
"""
from __future__ import annotations

import torch

from . import reference
from .config import VCConfig
from .operands import N_ALIGN, PreparedOperands, low_coefficients


def emulate_attention(ops: PreparedOperands, config: VCConfig, out_dtype: torch.dtype,
                      offset_block: int = N_ALIGN) -> torch.Tensor:
    """The kernel's output (B,H,N,D) from the operands, in float64 rounded to out_dtype.

    O = (sum_j P_j (v_scale * R_j) + l_j mu_j) / sum_j l_j with P from the running-max softmax of
    reference.quantize_p and l_j the row sums of the same quantized P over key block j; with the
    low-rank operands, plus (sum_j P_j A_j) W / sum_j l_j; with the second residual term (v_lo_t), R_j of its
    channels is hi + lo. offset_block: keys per online-softmax step of
    the kernel emulated (Backend.softmax_step).
    """
    n = ops.n_tokens
    acc, scale = reference.score_parts(ops.q_q[:, :, :n], ops.q_scale, ops.k_q[:, :, :n], ops.k_scale, n)
    p = reference.quantize_p(acc * scale, config, offset_block, acc=acc, scale=scale,
                             lanes=ops.k_scale.dim() == 4).double()
    codes = ops.v_t.float()[:, :, :, :n].transpose(-1, -2)
    if ops.v_lo_t is not None:  # the second term on its channels (VCConfig.v_lo_channels), same scale
        lo = ops.v_lo_t.float()[:, :, :, :n].transpose(-1, -2)
        codes = codes.scatter_add(-1, ops.v_lo_sel.long().unsqueeze(-2).expand_as(lo), lo)
    v_res = codes.double() * ops.v_scale.double().unsqueeze(-2)
    mean = reference.expand_rows(ops.v_mean.double(), N_ALIGN, n)
    v_hat = v_res + mean
    if ops.v_low_t is not None:
        coeff = low_coefficients(ops)[:, :, :n].double() * ops.v_low_scale.double().unsqueeze(-2)
        v_hat = v_hat + coeff @ ops.v_low_basis.double()
    return reference.to_output_dtype((p @ v_hat) / p.sum(-1, keepdim=True), out_dtype)
