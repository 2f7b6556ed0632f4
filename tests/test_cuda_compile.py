"""nvcc compile-only of every CUDA source of the portable kernels for each target arch (no GPU).

Each (source, arch) pair is compiled once, in parallel, with the JIT's own flags; the sm90_* sources
belong to the Hopper backend and are compiled by its tests.
"""
import concurrent.futures
import os
import shutil
import subprocess

import pytest

from vc_attention.kernels import jit

ARCHS = ("8.9", "9.0a", "12.0a")
SOURCES = sorted(p for p in jit.CSRC_DIR.glob("*.cu") if not p.name.startswith("sm90_"))

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"), reason="nvcc not installed")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("cubin")
    nvcc = jit.find_nvcc()

    def build(source, arch):
        cmd = jit.nvcc_compile_only_command(source, arch, out_dir / f"{source.stem}-{jit.arch_code(arch)}.cubin", nvcc)
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {(s.name, a): pool.submit(build, s, a) for s in SOURCES for a in ARCHS}
        return {key: fut.result() for key, fut in futures.items()}


def test_sources_found():
    names = {p.name for p in SOURCES}
    assert {"prepare.cu", "attn_mma.cu", "attn_mma_d64.cu", "attn_mma_d128.cu", "grouping.cu"} <= names


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", [p.name for p in SOURCES])
def test_compiles(compiled, source, arch):
    result = compiled[(source, arch)]
    assert result.returncode == 0, f"nvcc failed for {source} sm_{jit.arch_code(arch)}:\n{result.stderr}"
    assert "warning" not in result.stderr.lower(), result.stderr
