"""GPU tier of the public op's input checks: a bad perm never reaches the CUDA prepare kernel.

A caller's out-of-range value or repeated token (a silently wrong output) is refused before the
prepare kernel runs; the perm of our own grouping is trusted without a host sync, and even then the
kernel never reads outside the head (an out-of-range index reads its own slot's token).
"""
import pytest
import torch

from vc_attention.kernels import api, backends, grouping
from vc_attention.kernels.config import FIDELITY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _fast_backend(q):
    try:
        return backends.select(q, FIDELITY, "bhnd", allow_slow=False).name
    except backends.NoCapableBackend as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("broken", ["out_of_range", "negative", "duplicate"])
def test_a_bad_perm_is_refused_before_the_kernel(broken):
    q, k, v = (torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    name = _fast_backend(q)
    perm = grouping.group_tokens(v, 8, 1).perm()
    if broken == "out_of_range":
        perm[0, 1, 17] = 10**6
    elif broken == "negative":
        perm[0, 0, 0] = -1
    else:
        perm[0, 0, 3] = perm[0, 0, 4]
    before = api.BACKEND_CALLS[name]
    words = "perm must be a permutation" if broken == "duplicate" else r"perm values must lie in \[0, 300\)"
    with pytest.raises(ValueError, match=words):
        api.vc_attention(q, k, v, perm=perm, backend=name)
    assert api.BACKEND_CALLS[name] == before


def test_the_grouping_perm_runs_on_the_trusted_and_the_checked_path():
    q, k, v = (torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    name = _fast_backend(q)
    perm = grouping.group_tokens(v, 8, 1).perm()
    trusted = api.vc_attention(q, k, v, perm=perm, backend=name, perm_from_grouping=True)
    checked = api.vc_attention(q, k, v, perm=perm, backend=name)
    assert torch.equal(trusted, checked)


def test_the_kernel_never_reads_outside_the_head_on_the_trusted_path():
    q, k, v = (torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    name = _fast_backend(q)
    identity = torch.arange(300, device="cuda", dtype=torch.int32).expand(1, 2, 300).contiguous()
    corrupt = identity.clone()
    corrupt[0, 1, 17] = 10**9
    corrupt[0, 0, 5] = -7
    out = api.vc_attention(q, k, v, perm=corrupt, backend=name, perm_from_grouping=True)
    torch.cuda.synchronize()
    assert torch.equal(out, api.vc_attention(q, k, v, perm=identity, backend=name, perm_from_grouping=True))


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_the_output_takes_the_strides_of_dense_q(layout):
    """(B,H,N,D) views of (B,N,H,D) memory (what diffusers passes SDPA) give an output in (B,N,H,D) memory
    (kernels/prepared_run.py: empty_like(q)), so the caller's transpose-and-flatten is a view; the values
    equal those of the same call on contiguous copies."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    mem = [torch.randn(1, 700, 4, 128, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    q, k, v = ((t.transpose(1, 2) if layout == "bhnd" else t) for t in mem)
    name = _fast_backend(q)
    out = api.vc_attention(q, k, v, layout=layout, config=FIDELITY, backend=name)
    assert out.stride() == q.stride()
    if layout == "bhnd":
        assert out.transpose(1, 2).flatten(2, 3).data_ptr() == out.data_ptr()  # a view
        assert out.transpose(1, 2).is_contiguous()
    dense = api.vc_attention(*(t.contiguous() for t in (q, k, v)), layout=layout, config=FIDELITY, backend=name)
    assert dense.is_contiguous() and torch.equal(out, dense)
