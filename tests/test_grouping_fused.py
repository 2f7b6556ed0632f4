"""CPU tests of the fused grouping's host side (kernels/grouping_fused.py): which calls take the
fused path, the counted fallback to the torch implementation, the block count, and the shared-memory
sizes mirrored from csrc/grouping_params.h. The kernels themselves: tests/test_grouping_fused_gpu.py."""
import shutil
import subprocess

import pytest
import torch

from vc_attention.kernels import grouping, grouping_fused, jit


class CudaLike:
    """What unsupported_reason reads of a CUDA tensor, without a GPU."""

    def __init__(self, shape=(1, 2, 1000, 128), dtype=torch.bfloat16, strides=None, ptr=256):
        self.shape, self.dtype, self.is_cuda, self.device = shape, dtype, True, torch.device("cuda", 0)
        b, h, n, d = shape
        self._strides, self._ptr = strides or (h * n * d, n * d, d, 1), ptr

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def data_ptr(self):
        return self._ptr


@pytest.fixture
def h200_like(monkeypatch):
    monkeypatch.setattr(grouping_fused, "_runtime_reason", lambda: None)
    monkeypatch.setattr(grouping_fused, "_device_limits", lambda index: (132, 232448, 233472))
    monkeypatch.setattr(grouping_fused, "_disabled", None)


def test_supported_and_unsupported_inputs(h200_like):
    assert grouping_fused.unsupported_reason(CudaLike(), 64) is None
    assert grouping_fused.unsupported_reason(CudaLike(shape=(2, 32, 6144, 64), dtype=torch.float16), 256) is None
    assert "cpu" in grouping_fused.unsupported_reason(torch.zeros(1, 1, 4, 64), 64)
    assert "dtype" in grouping_fused.unsupported_reason(CudaLike(dtype=torch.float32), 64)
    assert "head dim 96" in grouping_fused.unsupported_reason(CudaLike(shape=(1, 2, 100, 96)), 64)
    assert "uint8" in grouping_fused.unsupported_reason(CudaLike(), 300)
    assert "65536 (batch, head) pairs" in grouping_fused.unsupported_reason(CudaLike(shape=(2048, 32, 64, 64)), 64)
    assert "aligned" in grouping_fused.unsupported_reason(CudaLike(ptr=258), 64)
    assert "aligned" in grouping_fused.unsupported_reason(CudaLike(strides=(1000 * 132, 132, 132 * 2, 1)), 64)
    assert "shared memory" in grouping_fused.unsupported_reason(CudaLike(), 256)  # 256 x 128 floats, twice


def test_an_ada_sized_gpu_still_takes_the_defaults(monkeypatch, h200_like):
    monkeypatch.setattr(grouping_fused, "_device_limits", lambda index: (128, 101376, 102400))  # sm_89
    assert grouping_fused.unsupported_reason(CudaLike(), grouping.DEFAULT_CLUSTERS) is None
    assert "shared memory" in grouping_fused.unsupported_reason(CudaLike(), 128)


def test_bf16_takes_the_tensor_core_pass_where_its_shared_memory_fits(monkeypatch):
    h200, ada = 232448, 101376  # opt-in shared memory per block
    assert grouping_fused.uses_tensor_cores(torch.bfloat16, 128, 64, h200)
    assert grouping_fused.uses_tensor_cores(torch.bfloat16, 128, 64, ada)  # the default fits sm_89 too
    assert grouping_fused.uses_tensor_cores(torch.bfloat16, 64, 256, h200)
    small = 90 * 1024  # the FP32 pass fits here, the three bf16 centroid terms do not: FP32 pass
    assert grouping_fused.pass_smem_bytes(128, 64) <= small < grouping_fused.pass_smem_bytes(128, 64, True)
    assert not grouping_fused.uses_tensor_cores(torch.bfloat16, 128, 64, small)
    assert not grouping_fused.uses_tensor_cores(torch.float16, 128, 64, h200)  # fp16 is not exact in bf16
    monkeypatch.setattr(grouping_fused, "TENSOR_CORES", False)
    assert not grouping_fused.uses_tensor_cores(torch.bfloat16, 128, 64, h200)


def test_three_bf16_terms_hold_a_float32_exactly():
    """The tensor-core pass's centroid split (csrc/grouping.cuh: term = bf16(rest), rest -= term):
    the terms add up to the float32 value exactly, so x.c loses nothing before the accumulation."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200000, generator=gen) * torch.exp(6.0 * torch.randn(200000, generator=gen))
    rest, total = x.clone(), torch.zeros_like(x, dtype=torch.float64)
    for _ in range(grouping_fused.SPLITS):
        term = rest.bfloat16().float()
        total += term.double()
        rest = rest - term
    assert torch.equal(total, x.double())
    assert not torch.equal(x.bfloat16().double() + (x - x.bfloat16().float()).bfloat16().double(), x.double())  # 2 terms do not


def test_block_count_depends_on_shape_and_gpu_only(h200_like):
    dev = torch.device("cuda", 0)
    wan14b = grouping_fused.parts_for(dev, 40, 75600, 128, 64)
    assert 1 < wan14b <= -(-75600 // grouping_fused.TILE_TOKENS)
    assert wan14b * 40 >= 2 * 132  # fills the GPU
    assert grouping_fused.parts_for(dev, 40, 1, 128, 64) == 1  # never more blocks than tiles
    assert grouping_fused.parts_for(dev, 2000, 75600, 128, 64) == 1


def test_cpu_calls_take_the_torch_path_and_are_counted():
    before = grouping_fused.PATH_CALLS["torch: V is on cpu"]
    grouping.group_tokens(torch.randn(1, 2, 300, 64), 16, 2).perm()
    grouping.kmeans(torch.randn(1, 2, 300, 64), 16, 2)
    assert grouping_fused.PATH_CALLS["torch: V is on cpu"] == before + 2


class LabelsLike:
    """What labels_unsupported_reason reads of CUDA labels, without a GPU."""

    def __init__(self, shape=(2, 12, 32760), dtype=torch.uint8):
        self.shape, self.dtype, self.is_cuda = shape, dtype, True

    def dim(self):
        return len(self.shape)


def test_which_cached_labels_the_fused_permutation_sorts(h200_like):
    assert grouping_fused.labels_unsupported_reason(LabelsLike(), 64) is None
    assert grouping_fused.labels_unsupported_reason(LabelsLike((1, 1, 1)), 1) is None
    assert "cpu" in grouping_fused.labels_unsupported_reason(torch.zeros(1, 1, 4, dtype=torch.uint8), 64)
    assert "uint8" in grouping_fused.labels_unsupported_reason(LabelsLike(dtype=torch.int16), 300)
    assert "uint8" in grouping_fused.labels_unsupported_reason(LabelsLike(), 300)
    assert "2-D" in grouping_fused.labels_unsupported_reason(LabelsLike((2, 12)), 64)
    assert "65536 (batch, head) pairs" in grouping_fused.labels_unsupported_reason(LabelsLike((2048, 32, 64)), 64)


def test_label_permutation_blocks_fill_the_gpu_and_never_exceed_the_tiles(h200_like):
    dev = torch.device("cuda", 0)
    parts = grouping_fused.label_parts(dev, 24, 32760)
    assert parts * 24 >= 4 * 132 and parts <= -(-32760 // grouping_fused.TILE_TOKENS)
    assert grouping_fused.label_parts(dev, 24, 40) == 1
    assert grouping_fused.label_parts(dev, 5000, 75600) == 1


def test_a_cached_grouping_on_the_cpu_sorts_with_torch_and_is_counted():
    labels = torch.randint(0, 16, (1, 2, 300), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    cached = grouping.CompactGrouping(labels=labels, counts=grouping._cluster_counts(labels.long(), 16))
    before = grouping_fused.PATH_CALLS["torch: labels are on cpu"]
    perm = cached.perm()
    assert grouping_fused.PATH_CALLS["torch: labels are on cpu"] == before + 1
    assert torch.equal(perm.long(), torch.argsort(labels, dim=-1, stable=True))


def test_a_failed_build_falls_back_for_the_process(monkeypatch):
    monkeypatch.setattr(grouping_fused, "_disabled", None)
    monkeypatch.setattr(grouping_fused, "unsupported_reason", lambda v, clusters: grouping_fused._disabled)
    calls = []

    def failing_build(*args):
        calls.append(1)
        raise jit.JitError("could not find nvcc: install the CUDA toolkit")

    monkeypatch.setattr(grouping_fused, "run", failing_build)
    v = torch.randn(1, 2, 300, 64)
    expected = grouping.group_tokens(v, 16, 2)  # fails the build, then runs the torch path
    again = grouping.group_tokens(v, 16, 2)  # no second build attempt
    assert calls == [1]
    assert "could not be built (could not find nvcc" in grouping_fused._disabled
    assert torch.equal(expected.labels, again.labels)
    assert any("could not be built" in key for key in grouping_fused.PATH_CALLS)


def test_the_fused_permutation_is_handed_out_once():
    labels = torch.tensor([[[1, 0, 1, 0]]], dtype=torch.uint8)
    g = grouping.CompactGrouping(labels=labels, counts=torch.tensor([[[2, 2]]], dtype=torch.int32),
                                 fresh_perm=torch.tensor([[[1, 3, 0, 2]]], dtype=torch.int32))
    assert g.perm().tolist() == [[[1, 3, 0, 2]]] and g.fresh_perm is None
    assert g.perm().tolist() == [[[1, 3, 0, 2]]]  # recomputed from the labels: the same stable sort
    assert g.nbytes == 4 + 8


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_shared_memory_sizes_mirror_the_header(tmp_path):
    cases = [(64, 1), (64, 64), (64, 256), (128, 16), (128, 64), (128, 100), (128, 192)]
    program = tmp_path / "sizes.cpp"
    program.write_text(
        '#include <cstdio>\n#include "grouping_params.h"\nint main() {\n'
        + "".join(f'  std::printf("%lld %lld %lld\\n", (long long)vc::group_pass_smem_bytes({d}, {c}, false), '
                  f"(long long)vc::group_pass_smem_bytes({d}, {c}, true), "
                  f"(long long)vc::group_order_smem_bytes({d}, {c}));\n" for d, c in cases)
        + "}\n"
    )
    for build in grouping_fused.VARIANTS:  # the order kernel's Gram matrix depends on the build
        exe = tmp_path / f"sizes-{build}"
        subprocess.run(["g++", "-std=c++17", f"-I{jit.CSRC_DIR}", *grouping_fused.VARIANTS[build], str(program), "-o", str(exe)],
                       check=True)
        printed = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
        for (d, c), line in zip(cases, printed):
            expected = (grouping_fused.pass_smem_bytes(d, c), grouping_fused.pass_smem_bytes(d, c, True),
                        grouping_fused.order_smem_bytes(d, c, build))
            assert line == " ".join(map(str, expected)), (build, d, c)
