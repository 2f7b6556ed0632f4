"""backend_mma.restore_flags: which V-Smooth restore flags the portable kernel gets (CPU: the decision, not the kernel;
tests/test_vsmooth_segments_gpu.py runs the kernel with them)."""
import torch

from vc_attention.kernels import backend_mma
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED
from vc_attention.kernels.operands import PreparedOperands

MEAN_SCALED = (backend_mma.MEAN_SCALED_FLAG,)


def operands(slots: int, seg_end=None) -> PreparedOperands:
    z = torch.zeros(1)
    return PreparedOperands(q_q=z, q_scale=z, k_q=z, k_scale=z, v_t=z, v_scale=z, v_mean=torch.zeros(2, 3, slots, 64),
                            n_tokens=slots * 128, v_seg_end=seg_end)


def test_paired_means_without_segments_restore_once_per_pair():
    flags = backend_mma.restore_flags(operands(5), SPEED, MEAN_SCALED)
    assert flags.dtype == torch.uint8 and flags.shape == (2, 3, 5)
    assert flags[0, 0].tolist() == [0, 1, 0, 1, 1]  # every second slot, and the last one alone
    assert backend_mma.restore_flags(operands(4), SPEED, MEAN_SCALED)[1, 2].tolist() == [0, 1, 0, 1]
    # made once per shape and device
    assert backend_mma.restore_flags(operands(5), SPEED, MEAN_SCALED) is flags


def test_segments_pass_through_and_other_configurations_restore_every_tile():
    seg = torch.tensor([[[0, 0, 1]] * 3] * 2, dtype=torch.uint8)
    assert backend_mma.restore_flags(operands(3, seg), SPEED, MEAN_SCALED) is seg
    assert backend_mma.restore_flags(operands(3), FIDELITY, MEAN_SCALED) is None  # 128-row means: one per tile
    assert backend_mma.restore_flags(operands(3, seg), PLAIN_8BIT, MEAN_SCALED) is None  # no V-Smooth, no means
    assert backend_mma.restore_flags(operands(3), SPEED, ()) is None  # a build that reads no flags


def test_the_flags_are_kept_per_shape_and_bounded():
    backend_mma._PAIR_FLAGS.clear()
    for slots in range(1, backend_mma._PAIR_FLAGS_KEPT + 5):
        backend_mma.pair_restore_flags(1, 1, slots, torch.device("cpu"))
    assert len(backend_mma._PAIR_FLAGS) == backend_mma._PAIR_FLAGS_KEPT
    assert (1, 1, 1, torch.device("cpu")) not in backend_mma._PAIR_FLAGS  # the oldest went first
