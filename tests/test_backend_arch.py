"""Which backend `auto` picks per GPU family, and that its JIT targets an arch the compile tests
build (CPU: the device capability and the CUDA runtime are mocked).

On a B200 (sm_100) the Hopper-only sm90 backend declines and the portable `mma` backend runs,
JIT-built for sm_100a, which tests/test_cuda_compile.py compiles in CI.
"""
import pytest
import torch

from vc_attention.kernels import backend_mma, backends, jit
from vc_attention.kernels.config import SPEED

from .test_cuda_compile import ARCHS as COMPILED_ARCHS

FAMILIES = {  # capability -> (backend chosen under auto, arch its JIT builds)
    (8, 9): ("mma", "8.9"),      # Ada: RTX 4090, L40S
    (9, 0): ("sm90", "9.0a"),    # Hopper: H100, H200
    (10, 0): ("mma", "10.0a"),   # Blackwell datacenter: B200
    (12, 0): ("mma", "12.0a"),   # consumer Blackwell: RTX 5090
}


@pytest.fixture
def gpu_of(monkeypatch):
    """Pretend the process sees a CUDA GPU of the given capability, with a toolkit."""
    def pretend(capability, name="NVIDIA mocked GPU"):
        monkeypatch.setattr(torch.version, "cuda", "13.0")
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(backend_mma, "_device_name", lambda index: name)  # cached per process otherwise
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(backends, "_CAPABILITIES", {})  # asked once per device and process
        monkeypatch.setattr(jit, "toolchain_reason", lambda arch=None: None)
        monkeypatch.delenv(jit.ENV_PREFIX + "ARCH", raising=False)
        for backend in backends.backends():
            monkeypatch.setattr(backend, "_availability", None)  # availability is cached per process
    return pretend


def _auto_choice() -> str:
    """The fastest backend that is available here (what `auto` picks for a supported call)."""
    return next(b.name for b in backends.backends() if b.availability() is None and not b.slow)


@pytest.mark.parametrize("capability", list(FAMILIES))
def test_auto_picks_a_backend_built_for_the_gpu(gpu_of, capability):
    gpu_of(capability)
    backend, arch = FAMILIES[capability]
    assert _auto_choice() == backend
    assert jit.target_arch() == arch
    assert arch in COMPILED_ARCHS, f"sm_{jit.arch_code(arch)} is not compiled by tests/test_cuda_compile.py"


def test_b200_runs_mma_built_for_sm100a(gpu_of):
    gpu_of((10, 0))
    reasons = dict(backends.describe())
    assert "sm_90 only" in reasons["sm90"]
    assert reasons["mma"] is None
    spec = jit.make_spec(backend_mma.EXTENSION_NAME, backend_mma.SOURCES)
    assert spec.arch == "10.0a"
    assert "-gencode=arch=compute_100a,code=sm_100a" in spec.cuda_flags


def test_below_ada_has_no_cuda_backend(gpu_of):
    gpu_of((8, 6))
    assert "sm_89" in dict(backends.describe())["mma"]


@pytest.mark.parametrize("capability", [c for c, (backend, _) in FAMILIES.items() if backend == "mma" or c == (9, 0)])
def test_mma_runs_the_wide_build_with_fp8_through_f16_only_where_fp8_mma_sync_is_missing(gpu_of, capability, monkeypatch):
    """The `mma` backend's build per family: the wide layout with whole-sector copies everywhere, the FP8
    MMA as two f16 MMAs only on sm_90a / sm_100a (no native FP8 mma.sync there; RTX keeps its QMMA).
    What extension() hands the JIT is recorded, not built."""
    gpu_of(capability)
    built = []
    monkeypatch.setattr(jit, "load_extension", lambda name, sources, extra_cuda_cflags=(), **kw: built.append(
        (name, tuple(extra_cuda_cflags))) or name)
    backend_mma._extension.cache_clear()
    try:
        backend_mma.extension()
    finally:
        backend_mma._extension.cache_clear()  # the JIT was mocked: forget its "module"
    (name, flags), = built
    assert flags == backend_mma.default_flags()
    assert {"-DVC_MMA_WIDE=1", "-DVC_MMA_COALESCED_COPY=1", "-DVC_MMA_RESTORE_PER_TILE=1"} <= set(flags)
    assert ("-DVC_MMA_E4M3_VIA_F16=1" in flags) == (FAMILIES[capability][1] in ("9.0a", "10.0a"))
    # the wide layout steps its online softmax by 64 keys: the emulation the GPU suites use for it
    assert backends.get("mma").softmax_step(128, SPEED) == 64
    # module names stay short (the JIT cache path repeats them; Windows allows 260 characters)
    assert len(name) <= len(backend_mma.EXTENSION_NAME) + 11 and name != backend_mma.extension_name(())


@pytest.mark.parametrize("capability,name,accum", [
    ((8, 9), "NVIDIA GeForce RTX 4090", "fp32+fp16"),
    ((12, 0), "NVIDIA GeForce RTX 5090", "fp32+fp16"),
    ((8, 9), "NVIDIA L40S", "fp32"),
    ((8, 9), "NVIDIA RTX 6000 Ada Generation", "fp32"),
    ((9, 0), "NVIDIA H200", "fp32"),
    ((10, 0), "NVIDIA B200", "fp32"),
])
def test_mma_accumulates_pv_in_fp16_partials_on_geforce(gpu_of, monkeypatch, capability, name, accum):
    """GeForce Ada / consumer Blackwell halve the FP8 MMA rate with an fp32 accumulator: there the backend's
    build accumulates each 64-key PV partial in fp16 (SageAttention 2.2's fp32+fp16 there); elsewhere fp32.
    The build it picks is a named variant with that flag, and the override wins both ways."""
    from vc_attention.kernels import mma_pv_f16, mma_variants

    gpu_of(capability, name)
    monkeypatch.delenv(mma_variants.PV_ACCUM_ENV, raising=False)
    assert backend_mma.pv_accum() == accum
    flags = backend_mma.default_flags()
    assert mma_pv_f16.uses_shifted_v(flags) == (accum == "fp32+fp16")
    assert flags in mma_variants.VARIANTS.values()
    other = "fp32" if accum == "fp32+fp16" else "fp32+fp16"
    monkeypatch.setenv(mma_variants.PV_ACCUM_ENV, other)
    assert backend_mma.pv_accum() == other
    assert mma_pv_f16.uses_shifted_v(backend_mma.default_flags()) == (other == "fp32+fp16")


def test_pv_accum_override_is_checked(gpu_of, monkeypatch):
    from vc_attention.kernels import mma_variants

    gpu_of((8, 9), "NVIDIA GeForce RTX 4090")
    monkeypatch.setenv(mma_variants.PV_ACCUM_ENV, "fp16")
    with pytest.raises(ValueError, match="VC_ATTENTION_MMA_PV_ACCUM"):
        backend_mma.pv_accum()
