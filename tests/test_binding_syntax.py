"""The torch bindings (kernels/csrc/*_binding.cpp) compile: a C++ syntax check without a GPU.

The bindings are built only by the JIT on a GPU machine, so a mistake in one surfaced there, at the
cost of device time. Here each is checked with the host compiler against the installed torch's headers,
the CUDA toolkit's headers and the constants the JIT passes (g++ -fsyntax-only). A CPU build of torch
lacks one generated CUDA header (c10/cuda/impl/cuda_cmake_macros.h); a stand-in defining what it
defines is put on the include path only when it is missing.
"""
import concurrent.futures
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from vc_attention.kernels import constants, jit

BINDINGS = sorted(jit.CSRC_DIR.glob("*_binding.cpp"))


def _cuda_include() -> Path | None:
    """The CUDA toolkit's include folder: CUDA_HOME / CUDA_PATH, nvcc's own folder (nvcc may be a wrapper
    script elsewhere on PATH), or /usr/local/cuda."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    try:
        roots.append(str(Path(jit.find_nvcc()).resolve().parents[1]))
    except jit.JitError:
        pass
    roots.append("/usr/local/cuda")
    return next((Path(r, "include") for r in roots if r and Path(r, "include", "cuda_runtime_api.h").exists()), None)


pytestmark = pytest.mark.skipif(shutil.which("g++") is None or _cuda_include() is None,
                                reason="needs g++ and a CUDA toolkit's headers")


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], str(_cuda_include()), str(jit.CSRC_DIR)]
    if not any(Path(p, "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in includes):
        stub = tmp_path_factory.mktemp("stub")
        (stub / "c10/cuda/impl").mkdir(parents=True)
        (stub / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.append(str(stub))
    flags = ["-std=c++17", "-fsyntax-only", "-w", "-DTORCH_EXTENSION_NAME=syntax_check", "-DTORCH_API_INCLUDE_EXTENSION_H",
             *constants.cuda_defines(), *(f"-I{p}" for p in includes)]

    def check(source: Path):
        return subprocess.run(["g++", *flags, str(source)], capture_output=True, text=True, check=False)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(zip((b.name for b in BINDINGS), pool.map(check, BINDINGS)))


def test_every_binding_is_found():
    assert {b.name for b in BINDINGS} >= {"prepare_binding.cpp", "sm90_binding.cpp", "attn_mma_binding.cpp",
                                          "grouping_binding.cpp"}


@pytest.mark.parametrize("name", [b.name for b in BINDINGS])
def test_binding_compiles(checked, name):
    done = checked[name]
    assert done.returncode == 0, f"{name} does not compile:\n{done.stderr[-3000:]}"
