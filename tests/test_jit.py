"""JIT build plumbing without a GPU: cache keys, the build lock, and every error sentence."""
import contextlib
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from vc_attention.kernels import jit


@pytest.fixture
def sources(tmp_path):
    src = tmp_path / "kernel.cu"
    src.write_text("__global__ void k() {}\n")
    return [src]


def _dir(sources, arch="9.0a", flags=()):
    return jit.make_spec("demo", sources, extra_cuda_cflags=flags, arch=arch).directory


def test_cache_dir_changes_with_flags_arch_and_sources(sources, tmp_path, monkeypatch):
    monkeypatch.setenv("VC_ATTENTION_CACHE_DIR", str(tmp_path / "cache"))
    base = _dir(sources)
    assert _dir(sources) == base
    assert _dir(sources, flags=("-DVARIANT=1",)) != base
    assert _dir(sources, arch="8.9") != base
    sources[0].write_text("__global__ void k() { }\n")
    assert _dir(sources) != base


def test_cache_dir_names_versions_and_arch(sources, tmp_path, monkeypatch):
    monkeypatch.setenv("VC_ATTENTION_CACHE_DIR", str(tmp_path / "cache"))
    name = _dir(sources, arch="12.0a").name
    assert name.startswith("demo-v") and "-sm120a-" in name
    assert f"torch{torch.__version__.split('+')[0]}" in name
    assert _dir(sources).parent == tmp_path / "cache"


def test_headers_are_part_of_the_key(sources, tmp_path, monkeypatch):
    monkeypatch.setattr(jit, "CSRC_DIR", tmp_path)
    header = tmp_path / "common.cuh"
    header.write_text("#define A 1\n")
    before = jit.make_spec("demo", sources, arch="9.0a").key
    header.write_text("#define A 2\n")
    assert jit.make_spec("demo", sources, arch="9.0a").key != before


def _hold_lock(directory, hold_s, started):
    with jit.build_lock(Path(directory)):
        started.set()
        time.sleep(hold_s)


def test_build_lock_excludes_a_second_process(tmp_path):
    ctx = multiprocessing.get_context("fork")
    started = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path), 1.0, started))
    holder.start()
    assert started.wait(10)
    t0 = time.perf_counter()
    with jit.build_lock(tmp_path):
        waited = time.perf_counter() - t0
    holder.join()
    assert waited > 0.5


def test_lock_rechecks_before_building(sources, tmp_path, monkeypatch):
    """A process that waited for the lock must load what the other one built, not build again."""
    monkeypatch.setenv("VC_ATTENTION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit, "check_torch_cuda", lambda: None)
    spec = jit.make_spec("demo", sources, arch="9.0a")
    built = []

    def fake_lock(directory):
        class Lock:
            def __enter__(self):
                spec.library.parent.mkdir(parents=True, exist_ok=True)
                spec.library.write_text("built by another process")
            def __exit__(self, *exc):
                return False
        return Lock()

    monkeypatch.setattr(jit, "build_lock", fake_lock)
    monkeypatch.setattr(jit, "_compile", lambda s, v: built.append(s))
    monkeypatch.setattr(jit, "_import_library", lambda s: "loaded")
    assert jit.load_extension("demo", sources, arch="9.0a") == "loaded"
    assert built == []


def test_error_torch_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(jit.JitError, match="without CUDA; install a CUDA build of PyTorch"):
        jit.check_torch_cuda()


def test_error_no_nvcc(monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(jit.JitError, match="could not find nvcc: install the CUDA toolkit"):
        jit.find_nvcc()


def test_nvcc_found_through_cuda_home(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.2, V12.2.140'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert jit.find_nvcc() == str(fake)
    assert jit.nvcc_version(str(fake)) == (12, 2)


def test_error_nvcc_too_old():
    with pytest.raises(jit.JitError, match=r"nvcc 12.2 is too old to build for sm_90a; install CUDA 12.4"):
        jit.check_nvcc_version((12, 2), "9.0a")
    with pytest.raises(jit.JitError, match=r"sm_120a; install CUDA 12.8"):
        jit.check_nvcc_version((12, 6), "12.0a")
    jit.check_nvcc_version((13, 0), "12.0a")


def test_error_gpu_without_fp8_tensor_cores():
    with pytest.raises(jit.JitError, match="sm_86, which has no FP8 tensor cores.*backend='reference'"):
        jit.arch_for_capability(8, 6)


@pytest.mark.parametrize("cap,arch", [((8, 9), "8.9"), ((9, 0), "9.0a"), ((12, 0), "12.0a"), ((12, 1), "12.1")])
def test_arch_for_capability(cap, arch):
    assert jit.arch_for_capability(*cap) == arch


def test_arch_override_and_its_error(monkeypatch):
    monkeypatch.setenv("VC_ATTENTION_ARCH", "8.9")
    assert jit.target_arch() == "8.9"
    assert jit.gencode_flags("9.0a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    monkeypatch.setenv("VC_ATTENTION_ARCH", "hopper")
    with pytest.raises(jit.JitError, match="is not an arch like"):
        jit.target_arch()


def test_error_no_gpu(monkeypatch):
    monkeypatch.delenv("VC_ATTENTION_ARCH", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(jit.JitError, match="no CUDA GPU is visible"):
        jit.target_arch()


def test_disable_jit_refuses_to_compile(sources, tmp_path, monkeypatch):
    monkeypatch.setenv("VC_ATTENTION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VC_ATTENTION_DISABLE_JIT", "1")
    monkeypatch.setattr(jit, "check_torch_cuda", lambda: None)
    monkeypatch.setattr(jit, "_compile", lambda s, v: pytest.fail("compiled although the JIT is disabled"))
    with pytest.raises(jit.JitError, match="DISABLE_JIT is set.*run `vc-attention build` once without it"):
        jit.load_extension("demo", sources, arch="9.0a")


def test_failed_build_shows_compiler_output(sources, tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setenv("VC_ATTENTION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit, "check_torch_cuda", lambda: None)
    monkeypatch.setattr(jit, "find_nvcc", lambda: "nvcc")
    monkeypatch.setattr(jit, "nvcc_version", lambda nvcc: (13, 0))

    def failing_load(**kwargs):
        raise RuntimeError("Error building extension: kernel.cu(3): error: identifier \"x\" is undefined")

    monkeypatch.setattr(cpp_extension, "load", failing_load)
    with pytest.raises(jit.JitError, match=r"(?s)building demo for sm_90a failed; compiler output.*identifier \"x\" is undefined"):
        jit.load_extension("demo", sources, arch="9.0a")


def test_first_build_says_what_where(sources, tmp_path, monkeypatch, capsys):
    from torch.utils import cpp_extension

    monkeypatch.setenv("VC_ATTENTION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit, "check_torch_cuda", lambda: None)
    monkeypatch.setattr(jit, "find_nvcc", lambda: "nvcc")
    monkeypatch.setattr(jit, "nvcc_version", lambda nvcc: (13, 0))
    seen = {}
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: seen.update(kw) or "module")
    assert jit.load_extension("demo", sources, arch="8.9") == "module"
    err = capsys.readouterr().err
    assert "building demo for sm_89" in err and str(tmp_path / "cache") in err
    assert "-gencode=arch=compute_89,code=sm_89" in seen["extra_cuda_cflags"]


def test_doctor_reports_every_backend(capsys):
    from vc_attention.cli import main
    from vc_attention.kernels import backends

    assert main(["doctor", "--json"]) == 0
    import json

    facts = json.loads(capsys.readouterr().out)
    assert set(facts["backends"]) == {b.name for b in backends.backends()}
    assert facts["cache_dir"] == str(jit.cache_root())
    if not torch.cuda.is_available():
        assert facts["backends"]["mma"] != "available"


def test_pack_version_comes_from_pyproject_of_the_sources():
    import re
    from pathlib import Path

    from vc_attention.kernels import jit

    text = (Path(jit.__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert jit.pack_version() == re.search(r'^version\s*=\s*"([^"]+)"', text, flags=re.M).group(1)


def test_toolchain_reason_names_the_missing_nvcc_unless_jit_is_disabled(monkeypatch, tmp_path):
    from vc_attention.kernels import jit

    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "could not find nvcc" in jit.toolchain_reason()
    monkeypatch.setenv(jit.ENV_PREFIX + "DISABLE_JIT", "1")
    assert jit.toolchain_reason() is None


def _cuda_free_build(monkeypatch, tmp_path, cache):
    """load_extension's plumbing on this machine: no CUDA torch needed, compile counted, not run."""
    monkeypatch.setenv("VC_ATTENTION_CACHE_DIR", str(cache))
    monkeypatch.setattr(jit, "check_torch_cuda", lambda: None)
    builds = []

    def fake_compile(spec, verbose):
        builds.append(spec)
        return "rebuilt module"

    monkeypatch.setattr(jit, "_compile", fake_compile)
    return builds


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX owner and mode bits")
@pytest.mark.parametrize("problem", ["group_writable", "other_writable", "other_owner"])
def test_a_cache_others_could_write_is_refused_before_anything_is_loaded(sources, tmp_path, monkeypatch, problem):
    """A .so planted in a shared cache would run its constructor inside ComfyUI when imported."""
    cache = tmp_path / "cache"
    builds = _cuda_free_build(monkeypatch, tmp_path, cache)
    spec = jit.make_spec("demo", sources, arch="9.0a")
    spec.directory.mkdir(parents=True)
    spec.library.write_bytes(b"planted")
    monkeypatch.setattr(jit, "_import_library", lambda s: pytest.fail("imported from an unsafe cache"))
    if problem == "other_owner":
        os.chown(cache, os.getuid() + 4242, -1) if os.getuid() == 0 else pytest.skip("chown needs root")
        words = "belongs to another user"
    else:
        cache.chmod(0o775 if problem == "group_writable" else 0o757)
        words = r"writable by other users.*chmod go-w"
    with pytest.raises(jit.JitError, match=words):
        jit.load_extension("demo", sources, arch="9.0a")
    assert builds == []


def test_a_new_cache_is_created_private_whatever_the_umask(sources, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _cuda_free_build(monkeypatch, tmp_path, cache)
    old = os.umask(0o002)
    try:
        assert jit.load_extension("demo", sources, arch="9.0a") == "rebuilt module"
    finally:
        os.umask(old)
    spec = jit.make_spec("demo", sources, arch="9.0a")
    assert not (cache.stat().st_mode & 0o022) and not (spec.directory.stat().st_mode & 0o022)


def test_a_corrupt_cached_library_is_deleted_and_rebuilt_under_the_lock(sources, tmp_path, monkeypatch):
    builds = _cuda_free_build(monkeypatch, tmp_path, tmp_path / "cache")
    spec = jit.make_spec("demo", sources, arch="9.0a")
    spec.directory.mkdir(parents=True, mode=0o755)
    spec.library.write_bytes(b"\x7fELF truncated by an interrupted build")
    locked = []
    real_lock = jit.build_lock

    @contextlib.contextmanager
    def watched_lock(directory):
        with real_lock(directory):
            locked.append(True)
            yield
            locked.append(False)

    def compile_under_lock(spec_, verbose):
        assert locked == [True] and not spec_.library.exists()
        builds.append(spec_)
        return "rebuilt module"

    monkeypatch.setattr(jit, "build_lock", watched_lock)
    monkeypatch.setattr(jit, "_compile", compile_under_lock)
    assert jit.load_extension("demo", sources, arch="9.0a") == "rebuilt module"
    assert len(builds) == 1


def test_a_corrupt_cached_library_with_the_jit_disabled_says_so(sources, tmp_path, monkeypatch):
    builds = _cuda_free_build(monkeypatch, tmp_path, tmp_path / "cache")
    monkeypatch.setenv("VC_ATTENTION_DISABLE_JIT", "1")
    spec = jit.make_spec("demo", sources, arch="9.0a")
    spec.directory.mkdir(parents=True, mode=0o755)
    spec.library.write_bytes(b"not a library")
    with pytest.raises(jit.JitError, match="cannot be loaded.*run `vc-attention build` once without"):
        jit.load_extension("demo", sources, arch="9.0a")
    assert builds == []


@pytest.mark.parametrize("problem", ["cache_is_a_file", "read_only"])
def test_an_unusable_cache_path_is_one_jit_error(sources, tmp_path, monkeypatch, problem):
    cache = tmp_path / "cache"
    _cuda_free_build(monkeypatch, tmp_path, cache)
    if problem == "cache_is_a_file":
        cache.write_text("a file where the cache directory should be")
    else:  # as root chmod does not stop a write, so the refusal the OS would give is simulated
        cache.mkdir(mode=0o555)
        real_mkdir = Path.mkdir

        def refuse_inside_cache(self, *args, **kwargs):
            if cache in self.parents:
                raise PermissionError(13, "Permission denied", str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", refuse_inside_cache)
    with pytest.raises(jit.JitError, match=r"cannot be used \(.*\); set VC_ATTENTION_CACHE_DIR to a writable"):
        jit.load_extension("demo", sources, arch="9.0a")
