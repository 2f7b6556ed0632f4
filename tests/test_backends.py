"""Backend constraints declared as data: availability and per-call reasons derived by one shared code
path (kernels/backends.py), checked on the CPU with a fake GPU where a capability is needed."""
import pytest
import torch

from vc_attention.kernels import backends, jit
from vc_attention.kernels.config import FIDELITY, SPEED

HOPPER_ONLY = backends.Constraints(min_capability=(9, 0), max_capability=(9, 0), dtypes=(torch.float16, torch.bfloat16),
                                   head_dims=(64, 128), qk_formats=("int8",), aligned_rows=True,
                                   k_lane_scales=True)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA runtime with one GPU of a chosen compute capability; q on it is a meta-free stand-in."""
    cap = {"value": (9, 0)}
    monkeypatch.setattr(jit, "runtime_reason", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["value"])
    # a call's check reads the capability cached per device (backends._capability): the fake GPU's, live
    monkeypatch.setattr(backends, "_capability", lambda index: cap["value"])
    return cap


def test_the_capability_is_asked_of_torch_once_per_device(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or (9, 0))
    monkeypatch.setattr(backends, "_CAPABILITIES", {})
    assert [backends._capability(0) for _ in range(3)] == [(9, 0)] * 3
    assert backends._capability(1) == (9, 0)
    assert asked == [0, 1]


class _CudaLike:
    """Enough of a CUDA tensor for the constraint checks (device, dtype, shape, strides, pointer)."""

    def __init__(self, t: torch.Tensor):
        self._t, self.is_cuda, self.device, self.dtype, self.shape = t, True, torch.device("cuda", 0), t.dtype, t.shape

    def stride(self, dim=None):
        return self._t.stride() if dim is None else self._t.stride(dim)

    def data_ptr(self):
        return self._t.data_ptr()


def _q(d=128, dtype=torch.bfloat16):
    return _CudaLike(torch.zeros(1, 2, 64, d, dtype=dtype))


def test_each_violated_constraint_gives_its_own_sentence(fake_gpu):
    c = HOPPER_ONLY
    assert backends.call_reason(c, SPEED, "bnhd", _q()) is None
    assert "dtype float32" in backends.call_reason(c, SPEED, "bhnd", _q(dtype=torch.float32))
    assert "head dim 96" in backends.call_reason(c, SPEED, "bhnd", _q(d=96))
    assert "QK format 'fp8'" in backends.call_reason(c, FIDELITY.with_(qk="fp8"), "bhnd", _q())
    assert "not a CUDA GPU" in backends.call_reason(c, SPEED, "bhnd", torch.zeros(1, 2, 64, 128))
    misaligned = _CudaLike(torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16).transpose(-1, -2))
    assert backends.call_reason(c, SPEED, "bhnd", _q(), _q(), misaligned).startswith("v needs a contiguous last dim")
    fake_gpu["value"] = (8, 9)
    assert backends.call_reason(c, SPEED, "bhnd", _q()) == "the GPU is sm_89; this kernel runs on sm_90 only"
    assert backends.availability_reason(c) == "the GPU is sm_89; this kernel runs on sm_90 only"


def test_capability_ranges_read_as_sentences(fake_gpu):
    fake_gpu["value"] = (8, 6)
    newer = backends.Constraints(min_capability=(8, 9))
    assert backends.availability_reason(newer) == "the GPU is sm_86; this kernel needs sm_89 or newer"
    assert backends.availability_reason(backends.Constraints(min_capability=(8, 0), max_capability=(8, 6))) is None
    assert "sm_90 to sm_100" in backends.availability_reason(backends.Constraints(min_capability=(9, 0), max_capability=(10, 0)))


def test_builtin_backends_declare_their_constraints():
    from vc_attention.kernels import backend_mma, backend_sm90

    assert backends.get("sm90").constraints.min_capability == backends.get("sm90").constraints.max_capability == (9, 0)
    assert backend_sm90.CONSTRAINTS.jit_arch == backend_sm90.ARCH
    assert backends.get("mma").constraints.min_capability == jit.MIN_CAPABILITY
    assert backends.get("mma").constraints is backend_mma.CONSTRAINTS
    assert backends.get("reference").slow and backends.get("reference").constraints.device_type == "any"


def test_without_cuda_every_cuda_backend_says_why_and_the_reference_runs():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    q = torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16)
    reasons = dict(backends.describe(q, SPEED))
    assert reasons["reference"] is None
    assert reasons["mma"] and reasons["sm90"]  # e.g. "PyTorch 2.x+cpu has no CUDA"
    assert backends.select(q, SPEED, "bhnd").name == "reference"
    with pytest.raises(backends.NoCapableBackend, match="sm90: .*; mma: .*; reference: slow"):
        backends.select(q, SPEED, "bhnd", allow_slow=False)
