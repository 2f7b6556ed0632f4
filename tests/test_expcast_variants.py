"""ExpCast accuracy variants (study/expcast_variants.py): valid codes, monotone, agree with the
paper's ExpCast where they should, and the subnormal fixes never lose to the paper on a long row."""
import math
import re

import pytest
import torch

from vc_attention.kernels import reference as R
from vc_attention.kernels.config import FIDELITY, SPEED
from vc_attention.study import expcast_variants as X

ALL = sorted(X.VARIANTS)
# variants whose normal range (u >= -14) is the paper's ExpCast by construction
SAME_NORMAL_RANGE = ["paper", "paper_ftz", "subnormal_exact"]


def _sweep(lo: float = -30.0, hi: float = 0.0, steps: int = 60001) -> torch.Tensor:
    """u sweep as (steps, 4): four identical columns, so the hybrids' column split is covered."""
    return torch.linspace(lo, hi, steps).unsqueeze(-1).expand(-1, 4).contiguous()


def _tv(u: torch.Tensor, encode) -> torch.Tensor:
    p = torch.softmax(u.double() * math.log(2), dim=-1)
    p_hat = encode(u).double()
    return 0.5 * (p - p_hat / p_hat.sum(-1, keepdim=True)).abs().sum(-1)


@pytest.mark.parametrize("name", ALL)
def test_values_are_e4m3_values_in_range(name):
    p = X.VARIANTS[name].encode(_sweep())
    assert torch.equal(R.fp8_e4m3(p), p)  # every value survives an E4M3 round trip
    top = R.E4M3_MAX if "448" in name else 256.0
    assert p.min() >= 0 and p.max() <= top
    assert p[-1].min() > top / 2  # u = 0 lands in the top octave


@pytest.mark.parametrize("name", ALL)
def test_monotone_in_u(name):
    p = X.VARIANTS[name].encode(_sweep())
    assert bool((p[1:] >= p[:-1]).all())


@pytest.mark.parametrize("name", SAME_NORMAL_RANGE)
def test_equal_to_paper_in_normal_range(name):
    u = _sweep(-14.0, 0.0)
    assert torch.equal(X.VARIANTS[name].encode(u), X.paper(u))


def test_bits_cast_equals_paper_in_normal_range_away_from_rounding_boundaries():
    """bits_cast resolves u to 2^-13 (fixed point) where the paper's t has float32 precision: the
    codes may differ only within 2^-9 code units of a rounding boundary."""
    u = _sweep(-14.0, 0.0)[:, 0]
    t = u * 8 + torch.tensor(119.65)
    near_boundary = ((t - t.floor()) - 0.5).abs() < 2.0**-9
    differ = X.bits_cast(u) != X.paper(u)
    assert not bool((differ & ~near_boundary).any())
    assert differ.float().mean() < 1e-3


def test_hybrids_use_exp2_cast_on_every_other_column_pair():
    u = -torch.rand(64, 16, generator=torch.Generator().manual_seed(0)) * 20
    mufu = X._mufu_columns(16, u.device)
    assert mufu.tolist()[:8] == [True, True, False, False, True, True, False, False]
    for hybrid, alu in ((X.hybrid_paper, X.paper), (X.hybrid_bits, X.bits_cast)):
        p = hybrid(u)
        assert torch.equal(p[:, mufu], X.exp2_cast(u)[:, mufu])
        assert torch.equal(p[:, ~mufu], alu(u)[:, ~mufu])


def test_subnormal_exact_is_the_exact_cast_below_the_normal_range():
    u = torch.linspace(-19.0, -14.05, 40001)
    exact = X.exp2_cast(u)
    ties = (torch.exp2(u.double() + 17) - 0.5).remainder(1.0).abs() < 1e-6
    assert torch.equal(X.subnormal_exact(u)[~ties], exact[~ties])
    assert exact.max() > 0 and (X.paper(u) != exact).any()  # the range really differs for the paper


def test_exponent_bits_give_piecewise_linear_exp2():
    w = torch.rand(10000, generator=torch.Generator().manual_seed(3)) * 32 - 24
    y = w + torch.tensor(X.FIXED_POINT_MAGIC)
    w_fixed = y - X.FIXED_POINT_MAGIC  # w rounded to 2^-13, as the kernel holds it
    expected = torch.exp2(w_fixed.floor()) * (1 + w_fixed - w_fixed.floor())
    assert torch.equal(X._exponent_bits_to_float(y), expected)


@pytest.mark.parametrize("fix", ["subnormal_exact", "bits_cast"])
def test_subnormal_fix_never_worse_than_paper_on_long_rows(fix):
    """Rows of 32768 keys: the max at u = 0, every other key in [-19, -12] (about half the mass
    below the E4M3 normal range, as in long video attention rows)."""
    gen = torch.Generator().manual_seed(4)
    u = -12.0 - torch.rand(8, 32768, generator=gen) * 7
    u[:, 0] = 0.0
    tv_fix, tv_paper = _tv(u, X.VARIANTS[fix].encode), _tv(u, X.paper)
    assert bool((tv_fix <= tv_paper).all())
    assert tv_fix.mean() < 0.5 * tv_paper.mean()


def test_quantize_p_with_matches_reference_quantize_p():
    s = torch.randn(2, 3, 300, generator=torch.Generator().manual_seed(5)) * 6
    assert torch.equal(X.quantize_p_with(s, X.bits_cast_448), R.quantize_p(s, SPEED))
    assert torch.equal(X.quantize_p_with(s, X.paper), R.quantize_p(s, SPEED.with_(p="expcast_paper")))
    assert torch.equal(X.quantize_p_with(s, X.exp2_cast), R.quantize_p(s, FIDELITY))


def _stated_cost(variant):
    """(ALU, MUFU, cvt) per element as the encoder's docstring states it, or None if it does not."""
    doc = " ".join((variant.encode.__doc__ or "").split())
    same = re.search(r"Same instructions as (\w+)", doc)
    if same:
        other = X.VARIANTS[same.group(1)]
        return other.alu, other.mufu, other.cvt
    stated = re.search(r"Cost per element[^:]*:([^.]*(\.\d[^.]*)*)\.", doc)
    if not stated:
        return None
    text = stated.group(1).split("=")[-1]
    return tuple(float(m.group(1)) if (m := re.search(rf"(\d+(?:\.\d+)?) {unit}", text)) else 0.0
                 for unit in ("ALU", "MUFU", "cvt"))


def test_variant_table_costs_agree_with_each_encoders_own_statement():
    checked = 0
    for name, v in X.VARIANTS.items():
        assert v.name == name == v.encode.__name__ and v.note
        stated = _stated_cost(v)
        if stated is not None:
            assert (v.alu, v.mufu, v.cvt) == stated, name
            checked += 1
    assert checked >= 6
    # a hybrid costs the mean of its two halves
    for hybrid, other in (("hybrid_paper", "paper"), ("hybrid_bits", "bits_cast")):
        h, a, b = X.VARIANTS[hybrid], X.VARIANTS["exp2_cast"], X.VARIANTS[other]
        assert (h.alu, h.mufu, h.cvt) == ((a.alu + b.alu) / 2, (a.mufu + b.mufu) / 2, (a.cvt + b.cvt) / 2)
