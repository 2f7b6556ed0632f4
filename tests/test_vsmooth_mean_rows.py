"""V-Smooth means over 256 rows (VCConfig.v_mean_rows), the speed mode's choice: the spec, the config
checks and the node's mapping (CPU)."""
import pytest
import torch

from vc_attention.kernels import reference as R
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.prepare_reference import prepare_reference
from vc_attention.nodes import presets


def _v(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, n, 16, generator=g) + 3.0 * torch.randn(16, generator=g)).to(torch.bfloat16)


@pytest.mark.parametrize("n", [1, 128, 200, 256, 300, 1100])
def test_256_row_means_are_stored_once_per_128_rows_in_pairs(n):
    v = _v(n)
    got = R.vsmooth_means(v, 256)
    assert got.shape == (1, 2, -(-n // 128), 16) and got.dtype == torch.float16
    for j in range(got.shape[2]):
        rows = v[:, :, 256 * (j // 2): min(n, 256 * (j // 2) + 256)].float()
        assert torch.equal(got[:, :, j], rows.mean(2).to(torch.float16)), j
    assert torch.equal(R.vsmooth_means(v, 128), R.block_means_fp16(v))


def test_mean_rows_other_than_multiples_of_the_block_are_refused():
    with pytest.raises(ValueError, match="multiple of 128"):
        R.vsmooth_means(_v(300), 192)


def test_the_residual_is_taken_against_the_pair_mean():
    v = _v(700, seed=1)
    vs = R.quantize_v_vsmooth(v, mean_rows=256)
    assert torch.equal(vs.mean, R.vsmooth_means(v, 256))
    # what the kernels restore (mean + residual) reconstructs V up to the residual's FP8 error
    err = (vs.dequantized() - v.float()).abs().max()
    assert err <= vs.scale.max() * 448 * 2.0**-4
    assert torch.equal(R.dequantized_v(v, SPEED), vs.dequantized())
    assert not torch.equal(R.dequantized_v(v, SPEED), R.dequantized_v(v, SPEED.with_(k_lane_scales=False, v_mean_merge=False, v_mean_rows=128, k_scale_rows=128)))


def test_the_operand_contract_keeps_one_mean_per_128_rows():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 600, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    ops = prepare_reference(q, k, v, None, SPEED)
    assert ops.v_mean.shape == (1, 2, 5, 64)
    assert torch.equal(ops.v_mean[:, :, 0], ops.v_mean[:, :, 1]) and torch.equal(ops.v_mean[:, :, 2], ops.v_mean[:, :, 3])
    assert not torch.equal(ops.v_mean[:, :, 3], ops.v_mean[:, :, 4])  # the lone last block: its own rows


def test_config_checks_and_tags():
    assert SPEED.v_mean_rows == 256 and FIDELITY.v_mean_rows == 128 and PLAIN_8BIT.v_mean_rows == 128
    assert SPEED.tag.endswith("-mean256-merged-k256-lanes") and FIDELITY.tag == "int8-vsmooth-mixed-k256-lo30"
    for bad in (64, 512, 130, True, "256"):
        with pytest.raises(ValueError, match="v_mean_rows must be one of"):
            VCConfig(v_mean_rows=bad)
    with pytest.raises(ValueError, match="per-channel V has no block means"):
        VCConfig(v="per_channel", v_mean_rows=256)
    assert SPEED.with_rank(2).v_mean_rows == 256  # the low-rank term works on either mean


@pytest.mark.parametrize("mode,rows", [("speed", 256), ("balanced", 256), ("fidelity", 128)])
def test_presets_pick_the_mean_rows_with_the_encoding(mode, rows):
    widgets = dict(presets.PRESETS[mode])
    assert presets.config_from_widgets(widgets).v_mean_rows == rows
    widgets["v_smooth"] = False
    assert presets.config_from_widgets(widgets).v_mean_rows == 128
