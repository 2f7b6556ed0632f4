"""bench/v_rounding_study.py's balanced rounding does what the study says it measures (CPU), and
bench/mma_variants.py's '+' flags parse (one-off variants for a GPU call)."""
import importlib.util
from pathlib import Path

import pytest
import torch

from vc_attention.bench import v_rounding_study as study

REPO = Path(__file__).resolve().parents[1]


def test_the_neighbours_bracket_x_and_the_first_is_the_nearest():
    x = torch.randn(1, 1, 4096, 8) * 60
    q, alt = study.fp8_neighbours(x)
    assert torch.equal(q, x.to(torch.float8_e4m3fn).float())
    assert ((q - x) * (alt - x) <= 0).all() and ((q - x).abs() <= (alt - x).abs()).all()


def test_balanced_rounding_drives_each_block_sum_of_errors_down_at_a_small_cost():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 1024, 16, generator=gen) * 40
    nearest = x.to(torch.float8_e4m3fn).float()
    balanced = study.balanced_fp8(x, 128)
    assert torch.equal(balanced.to(torch.float8_e4m3fn).float(), balanced)  # still E4M3 values
    sums = lambda v: (v - x).reshape(1, 2, 8, 128, 16).sum(3).abs().mean()  # noqa: E731
    assert sums(balanced) < 0.2 * sums(nearest)
    assert ((balanced - x) ** 2).mean() < 1.1 * ((nearest - x) ** 2).mean()


def test_one_off_variant_flags_parse():
    spec = importlib.util.spec_from_file_location("mma_variants_bench", REPO / "bench" / "mma_variants.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # any registered name does (this one: the H100/H200 build until kernel-notes section 44)
    base = "wide-i2fp-meanscaled-restoretile-coalesced-viaf16"
    flags = bench.variant_flags(base + "+-DVC_MMA_MIN_BLOCKS=3")
    assert flags[-1] == "-DVC_MMA_MIN_BLOCKS=3" and flags[:-1] == bench.mma_variants.flags(base)
    with pytest.raises(SystemExit, match="-D flags"):
        bench.variant_flags(base + "+O3")


def test_k_codes_rounded_orthogonal_to_a_direction():
    from vc_attention.bench import fidelity_study as fs
    from vc_attention.bench import qk_term_study

    gen = torch.Generator().manual_seed(1)
    k = torch.randn(1, 2, 512, 64, generator=gen)
    d = torch.randn(1, 2, 1, 64, generator=gen)
    codes, scale = qk_term_study.int8_rows_orthogonal(k, [d])
    nearest, nearest_scale = fs.int8_rows(k, "128")
    assert torch.equal(scale, nearest_scale) and codes.abs().max() <= 127
    assert (codes - nearest).abs().max() <= 1  # only near-tie flips to the other neighbour
    proj = lambda c: ((c * scale - k) * d).sum(-1).abs().mean()  # noqa: E731
    assert proj(codes) < 0.5 * proj(nearest)  # 4x smaller on this data
    assert (codes != nearest).float().mean() < 0.1
