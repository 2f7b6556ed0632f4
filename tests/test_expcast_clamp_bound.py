"""The clamp-bound test of the speed kernels (csrc/p_encoding.cuh: expcast_int_no_wrap, int8_row_score_bound;
VC_EXPCAST_CLAMP_BOUND / VC_MMA_CLAMP_BOUND), checked on the CPU against the spec's integer form
(reference.expcast_bits): wherever the kernels' float test passes, no score the Q row's bound allows wraps its
32-bit t below 0, so the unclamped encode gives the spec's codes; and everything below the clamp is code 0.
"""
import numpy as np
import torch

from vc_attention.kernels import constants, reference as ref

TOP = np.float32(constants.EXPCAST_TOP)


def kernel_test(bound: np.ndarray, sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """fmaf(bound, sc, m) <= Top - 1 in float32 (one rounding of the exact float64 value)."""
    return (bound.astype(np.float64) * sc.astype(np.float64) + m.astype(np.float64)).astype(np.float32) <= TOP - 1


def cases(n: int, seed: int):
    rng = np.random.default_rng(seed)
    d = 128
    q = rng.integers(-127, 128, size=(n, d))
    bound = 128 * (np.abs(q).sum(-1) + d)  # int8_row_score_bound's figure: 128 sum(|q_d| + 1)
    sc = np.exp2(rng.uniform(-22, -4, size=n)).astype(np.float32)  # log2 units per integer score step
    a0 = (rng.uniform(-1, 1, size=n) * bound).astype(np.int64)
    # the running max after the step: at least this block's max; half the cases placed at the test's edge
    m = (a0 * sc.astype(np.float64) + rng.exponential(8.0, size=n)).astype(np.float32)
    edge = rng.random(n) < 0.5
    m[edge] = (TOP - 1 - bound[edge] * sc[edge].astype(np.float64) + rng.uniform(-0.02, 0.02, edge.sum())).astype(np.float32)
    m = np.maximum(m, (a0 * sc.astype(np.float64)).astype(np.float32))
    return bound, sc, a0, m


def test_a_passing_row_never_wraps_and_the_edge_is_exercised():
    bound, sc, a0, m = cases(200_000, seed=0)
    ok = kernel_test(bound, sc, m)
    assert 0.2 < ok.mean() < 0.9  # both outcomes, many of them within 0.02 log2 units of the edge
    t_low = ref.expcast_bits(torch.from_numpy(-bound[ok]), torch.from_numpy(sc[ok]), torch.from_numpy(a0[ok]),
                             torch.from_numpy(m[ok]))
    assert (t_low >= 0).all()  # no wrap for any score down to -bound
    t_top = ref.expcast_bits(torch.from_numpy(a0[ok]), torch.from_numpy(sc[ok]), torch.from_numpy(a0[ok]),
                             torch.from_numpy(m[ok]))
    assert (t_top < 2**31).all()  # T0 itself stays a 32-bit non-negative integer
    # and the margin is not wasted: rows a unit beyond the edge do wrap somewhere
    tight = ~ok & (bound * sc.astype(np.float64) + m > TOP + 1)
    t_tight = ref.expcast_bits(torch.from_numpy(-bound[tight]), torch.from_numpy(sc[tight]),
                               torch.from_numpy(a0[tight]), torch.from_numpy(m[tight]))
    assert (t_tight < 0).any()


def test_the_kernels_32_bit_form_equals_the_spec_on_passing_rows():
    bound, sc, a0, m = cases(2_000, seed=1)
    ok = kernel_test(bound, sc, m)
    rng = np.random.default_rng(2)
    for i in np.flatnonzero(ok)[:200]:
        s = np.concatenate([rng.integers(-bound[i], a0[i] + 1, size=64), [-bound[i], a0[i]]])
        spec = ref.expcast_bits(torch.from_numpy(s), torch.tensor(sc[i]), torch.tensor(a0[i]), torch.tensor(m[i])).numpy()
        t0 = int(spec[-1])
        a = int(np.rint(min(np.float32(sc[i]) * np.float32(2.0**23), np.float32(constants.EXPCAST_SLOPE_CAP))))
        add = (t0 - int(a0[i]) * a) % 2**32  # expcast_int_row's mul / add, as uint32
        unclamped = (s.astype(object) * a + add) % 2**32  # expcast_int_float_unclamped's IMAD
        assert [int(u) for u in unclamped] == [int(x) for x in spec]


def test_below_the_clamp_every_code_is_zero():
    # t(lo) is about 58.5 x 2^23: the float 2^(58.5 - 127), far below E4M3's smallest subnormal (2^-9)
    t = torch.tensor([0, 1, 2**23, int(58.5 * 2**23), int(60 * 2**23)], dtype=torch.int64)
    assert (ref.fp8_e4m3(ref.expcast_bits_float(t)) == 0).all()
