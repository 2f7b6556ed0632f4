"""GPU tier: the portable kernel's VC_MMA_RESTORE_AFTER (the V-Smooth mean restore after the chunk's PV loop,
docs/kernel-notes.md sections 43-44; in the default builds since section 44: every head dim on the native-FP8 archs,
head dim 64 only through f16) at every head dim (=1) against the emulation and against the same build without it.

Its restore adds l * mu / v_scale to O after the fold instead of inside it: the same terms in another fp32 order, so
its output stays within the variant gate of reference.py (as every build of tests/test_mma_variants_gpu.py) and within
a few bf16 roundings of the build without it, on random data with odd lengths (tail chunks) and on video-like data
whose grouping gives the speed mode's merged segments (restores at segment ends, not every tile).
"""
import pytest
import torch

from vc_attention.kernels import backend_mma, jit, mma_variants, reference
from vc_attention.kernels.config import FIDELITY as FIDELITY_PRESET, SPEED
from vc_attention.kernels.prepare_cuda import prepare_cuda

from .test_mma_restore_after_sass import without_restore_after
from .test_mma_variants_gpu import GATE, WIDE_STEP_KEYS, _qkv, _rel_l2, emulate_steps  # noqa: F401  (a fixture)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)"),
]

FLAG = "-DVC_MMA_RESTORE_AFTER=1"
CONFIGS = {"fidelity": FIDELITY_PRESET.without_refinements(), "speed": SPEED}


def _flags_without_restore_after() -> tuple[str, ...]:
    """This GPU's default build with the restore inside the PV fold (any -DVC_MMA_RESTORE_AFTER=... removed)."""
    flags = mma_variants.flags(mma_variants.default_variant(jit.target_arch(), backend_mma.pv_accum()))
    base = without_restore_after(flags)
    assert len(base) == len(flags) - 1  # the default build restores after the PV loop (=1; =2: at head dim 64 only)
    return base


def _run(flags, q, k, v, perm, config):
    ops = prepare_cuda(q, k, v, perm, config, "bhnd")
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")  # poisoned: every row must be written
    backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=flags)
    assert torch.isfinite(out).all()
    return out


def _compare(q, k, v, perm, config):
    base = _flags_without_restore_after()
    after_ext, base_ext = backend_mma.extension((*base, FLAG)), backend_mma.extension(base)
    assert after_ext is not base_ext  # a build of its own
    after, before = _run((*base, FLAG), q, k, v, perm, config), _run(base, q, k, v, perm, config)
    ref64 = reference.vc_attention_reference(q, k, v, config, perm=perm, parts=True).out
    rounding = _rel_l2(ref64.to(q.dtype), ref64)
    assert _rel_l2(after, ref64) <= GATE + rounding
    assert _rel_l2(after, before) <= 2 * rounding  # another fp32 order of the same sum: bf16-rounding differences
    return after, before


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n,d", [(77, 128), (4097, 128), (4097, 64), (1000, 64)])
def test_restore_after_matches_the_emulation_and_the_build_without_it(name, n, d, emulate_steps):
    emulate_steps(WIDE_STEP_KEYS)  # the wide layout's 64-key softmax steps
    q, k, v = _qkv(2, 3, n, d, torch.bfloat16, "bhnd", seed=n + d)
    perm = torch.argsort(torch.rand(2, 3, n, device="cuda"), dim=-1)
    _compare(q, k, v, perm, CONFIGS[name])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_restore_after_on_video_like_data_with_segments(name, emulate_steps):
    from vc_attention.study.fidelity import grouping_permutation
    from vc_attention.study.videodata import video_like_qkv

    emulate_steps(WIDE_STEP_KEYS)
    q, k, v = video_like_qkv(B=1, H=2, T=4, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, device="cuda")
    perm = grouping_permutation(v, 64, 8)
    _compare(q, k, v, perm, CONFIGS[name])
