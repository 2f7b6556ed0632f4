"""GPU tier: the prepare extension's build-time variants (kernels/prepare_cuda.VARIANTS) write the
default build's operands bit for bit (skips without a GPU).

"rows-in-regs" (csrc/prepare_regs.cuh), "legacy-quantize" (csrc/prepare.cuh's quantize pass, which the
default build's csrc/prepare_staged.cuh replaced) and "staged-stats" (csrc/prepare_staged.cuh's statistics
pass), "stats-prefetch" (the statistics pass with its permutation indices loaded first) only change
when each row is loaded and how the V^T tile
is transposed: the same arithmetic in the same order, so every operand (codes, scales, the V-Smooth
means) must be equal, not close: at odd N
(a partial last block), both head dims, fp16 / bf16, both layouts, INT8 and FP8 QK, with and without
V-Smooth and K smoothing, with a permutation, and on inputs with channel offsets and outliers.
"""
import dataclasses

import pytest
import torch

from vc_attention.kernels import prepare_cuda as prep
from vc_attention.kernels.config import FIDELITY as FIDELITY_PRESET, PLAIN_8BIT, SPEED, VCConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU (sm_89+)"),
]

# the prepare variants write no second V term (they refuse it): they are compared on the preset without it
FIDELITY = FIDELITY_PRESET.without_refinements()

CONFIGS = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT, "fp8qk": VCConfig(qk="fp8"),
           "nosmoothk": dataclasses.replace(FIDELITY, smooth_k=False)}
VARIANTS = [name for name, flags in prep.VARIANTS.items() if flags]


def _inputs(n, d, dtype, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (2, 3, n, d) if layout == "bhnd" else (2, n, 3, d)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda") for _ in range(3))
    k = k + 3.0 * torch.randn(d, generator=gen, device="cuda")  # K smoothing has work to do
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")  # V-Smooth territory
    v.view(-1, d)[:: max(1, n // 3), 0] *= 40.0  # a few outliers in one channel
    return q.to(dtype), k.to(dtype), v.to(dtype)


# (rows_in_regs, legacy_quantize, staged_stats, stats_prefetch) as each build reports them; the default:
# the staged quantize pass after prepare.cuh's statistics pass
EXPECTED_KERNELS = {"rows-in-regs": (1, 0, 0, 0), "legacy-quantize": (0, 1, 0, 0), "staged-stats": (0, 0, 1, 0),
                    "stats-prefetch": (0, 0, 0, 1)}


def _kernels(ext) -> tuple[int, int, int, int]:
    return ext.rows_in_regs(), ext.legacy_quantize(), ext.staged_stats(), ext.stats_prefetch()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n", [1, 130, 1000, 4097])
@pytest.mark.parametrize("d,dtype,layout", [(64, torch.float16, "bnhd"), (128, torch.bfloat16, "bhnd")])
def test_variant_writes_the_default_builds_operands_bit_for_bit(variant, name, n, d, dtype, layout):
    flags = prep.VARIANTS[variant]
    # each build runs the kernels it names (a flag that selected nothing would compare a build with itself)
    assert _kernels(prep.extension(flags)) == EXPECTED_KERNELS[variant] and _kernels(prep.extension()) == (0, 0, 0, 0)
    config = CONFIGS[name]
    if variant in prep.MEAN_128_ONLY:  # its statistics pass covers 128 rows a block (refusal: the test below)
        config = config.with_(v_mean_merge=False, v_mean_rows=128, k_scale_rows=128, k_lane_scales=False)
    else:  # every variant takes K scales per 128 keys only (refusal: the test below), so no lane scales either
        config = config.with_(k_scale_rows=128, k_lane_scales=False)
    q, k, v = _inputs(n, d, dtype, layout, seed=n + d)
    perm = torch.argsort(torch.rand(2, 3, n, device="cuda"), dim=-1)
    expected = prep.prepare_cuda(q, k, v, perm, config, layout)
    got = prep.prepare_cuda(q, k, v, perm, config, layout, variant_flags=flags)
    for field in dataclasses.fields(expected):
        a, b = getattr(expected, field.name), getattr(got, field.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(_bits(a), _bits(b)), f"{variant}: {field.name} differs"
        else:
            assert a == b, field.name


def test_unknown_variant_flags_are_refused():
    with pytest.raises(ValueError, match="unknown prepare variant"):
        prep.extension(("-DVC_PREP_SOMETHING=1",))


@pytest.mark.parametrize("variant", sorted(prep.MEAN_128_ONLY))
def test_variants_with_128_row_statistics_refuse_256_row_means(variant):
    q, k, v = _inputs(300, 128, torch.bfloat16, "bhnd", seed=1)
    assert SPEED.v_mean_rows == 256
    with pytest.raises(ValueError, match="128-row V means only"):
        prep.prepare_cuda(q, k, v, None, SPEED.with_(k_lane_scales=False), variant_flags=prep.VARIANTS[variant])


@pytest.mark.parametrize("variant", sorted(set(prep.VARIANTS) - {"default"} - prep.MEAN_128_ONLY))
def test_variants_refuse_256_key_k_scales(variant):
    """Only the default build pairs the K scales (its statistics pass takes the K extremes): a variant says
    so instead of writing per-128-key scales under a k_scale_rows 256 configuration."""
    q, k, v = _inputs(300, 128, torch.bfloat16, "bhnd", seed=1)
    assert SPEED.k_scale_rows == 256
    with pytest.raises(ValueError, match="K scales per 128 keys only"):
        prep.prepare_cuda(q, k, v, None, SPEED.with_(k_lane_scales=False), variant_flags=prep.VARIANTS[variant])
