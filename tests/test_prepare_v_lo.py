"""The CUDA prepare's plumbing of the V residual's second term (VCConfig.v_lo_channels) that runs without a GPU: the
binding's arguments and the Python refusals. The kernels' codes and channels: tests/test_prepare_v_lo_gpu.py."""
import pytest
import torch

from vc_attention.kernels import prepare_cuda as prep
from vc_attention.kernels.config import FIDELITY, SPEED


@pytest.mark.parametrize("config", [FIDELITY, FIDELITY.with_(v_lo_channels=16), SPEED.with_(v_lo_channels=32)])
def test_the_binding_arguments_end_with_the_channel_count(config):
    # prepare and prepare_attend take it after k_lanes; prepare_attend hands the term on to the Hopper entry, which
    # refuses a count its kernels do not take
    q = torch.zeros(1, 2, 300, 128, dtype=torch.bfloat16)
    args = prep.binding_args(q, q, q, None, config, "bhnd", None, None)
    assert len(args) == 14 and args[-1] == config.v_lo_channels
    assert args[-2] is config.k_lane_scales and args[10] == (config.v_mean_merge and config.v_mean_rows == 256)  # k_lanes, merges


@pytest.mark.parametrize("variant", [name for name in prep.VARIANTS if name != "default"])
def test_a_prepare_variant_build_refuses_the_term_before_building(variant):
    # CPU tensors: the refusal comes before the binding (and any build), as a sentence naming the field
    q = torch.zeros(1, 2, 300, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"prepare variant '{variant}' has no second V term.*v_lo_channels=32"):
        prep.prepare_cuda(q, q, q, None, FIDELITY.with_(v_lo_channels=32), variant_flags=prep.VARIANTS[variant])
