"""Build and load the CUDA extensions on first use (torch.utils.cpp_extension + ninja).

One entry point, `load_extension(name, sources, ...)`, used by every backend (the portable `mma`
kernels and the Hopper `sm90` ones). What it guarantees:
- a cache directory per (pack version, torch, CUDA, target arch, hash of sources + headers + flags),
  so a change to any of them builds afresh and nothing stale is ever loaded;
- a file lock around the build with a re-check after acquiring it: concurrent first uses build once,
  the other processes wait and load;
- one-sentence errors naming the remedy (no CUDA torch, no nvcc, nvcc too old, GPU below sm_89,
  JIT disabled, a cache that cannot be used) and the compiler output when a build fails;
- nothing is imported from a cache another user owns or can write (check_private), and a cached
  library that fails to load is deleted and rebuilt under the lock.

Environment overrides (one prefix, VC_ATTENTION_):
  VC_ATTENTION_ARCH       target arch, e.g. "9.0a", "8.9", "12.0a" (default: the current GPU's)
  VC_ATTENTION_CACHE_DIR  cache root (default: $XDG_CACHE_HOME or ~/.cache, then vc_attention/jit)
  VC_ATTENTION_VERBOSE    "1": show the compiler command lines and ptxas register/spill reports
  VC_ATTENTION_DISABLE_JIT "1": never compile; load only what an earlier build left in the cache
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from . import constants

ENV_PREFIX = "VC_ATTENTION_"
CSRC_DIR = Path(__file__).resolve().parent / "csrc"

# FP8 (e4m3) mma.sync needs PTX ISA 8.4 (CUDA 12.4); sm_120a needs CUDA 12.8.
MIN_NVCC = (12, 4)
MIN_NVCC_FOR_ARCH = {"12.0a": (12, 8), "10.0a": (12, 8)}
MIN_CAPABILITY = (8, 9)

# Flags every extension is built with (torch adds its own -std); the JIT hash covers them. The
# numeric constants shared with the Python spec come in as -D flags (kernels/constants.py).
BASE_CUDA_FLAGS = ("-O3", "--expt-relaxed-constexpr", "-lineinfo", "-DNDEBUG", *constants.cuda_defines())
BASE_CXX_FLAGS = ("-O3", *constants.cuda_defines())  # the bindings include vc_constants.h too


class JitError(RuntimeError):
    """The extension cannot be built or loaded here; the message says what to do about it."""


def env_flag(name: str) -> bool:
    return os.environ.get(ENV_PREFIX + name, "").strip().lower() in ("1", "true", "yes", "on")


def pack_version() -> str:
    """The pack's version: from pyproject.toml beside the sources (a git clone in custom_nodes is
    never pip-installed), else from the installed distribution's metadata."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), flags=re.M)
        if match:
            return match.group(1)
    try:
        return importlib.metadata.version("comfyui-vc-attention")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


# ----------------------------------------------------------------------------------------------
# toolchain and GPU checks
def check_torch_cuda() -> None:
    if torch.version.cuda is None:
        raise JitError(
            f"this PyTorch ({torch.__version__}) is built without CUDA; install a CUDA build of PyTorch "
            "to use the VC-Attention kernels (backend='reference' runs without one)."
        )


def runtime_reason() -> Optional[str]:
    """Why no CUDA kernel can run in this process at all (a CPU-only torch, no visible GPU), or None."""
    if torch.version.cuda is None:
        return f"PyTorch {torch.__version__} has no CUDA"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return None


def toolchain_reason(arch: Optional[str] = None) -> Optional[str]:
    """Why the JIT cannot build here (no nvcc; with `arch`, an nvcc too old for it), or None.

    With DISABLE_JIT set nothing is built, so the toolchain does not matter: a cached build may
    exist, and load_extension says precisely if it does not."""
    if env_flag("DISABLE_JIT"):
        return None
    try:
        nvcc = find_nvcc()
        if arch is not None:
            check_nvcc_version(nvcc_version(nvcc), arch)
    except JitError as err:
        return str(err)
    return None


def find_nvcc() -> str:
    """nvcc from CUDA_HOME / CUDA_PATH, else from PATH."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    raise JitError(
        "could not find nvcc: install the CUDA toolkit (12.4 or newer, 12.8 for Blackwell) and set "
        "CUDA_HOME to its folder, or put its bin/ on PATH."
    )


def nvcc_version(nvcc: str) -> tuple[int, int]:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"release (\d+)\.(\d+)", out)
    if not match:
        raise JitError(f"could not read the version of {nvcc} (`nvcc --version` printed {out.strip()!r}); check the CUDA install.")
    return int(match.group(1)), int(match.group(2))


def check_nvcc_version(version: tuple[int, int], arch: str) -> None:
    needed = max(MIN_NVCC, MIN_NVCC_FOR_ARCH.get(arch, MIN_NVCC))
    if version < needed:
        raise JitError(
            f"nvcc {version[0]}.{version[1]} is too old to build for sm_{arch_code(arch)}; install CUDA "
            f"{needed[0]}.{needed[1]} or newer and point CUDA_HOME at it."
        )


def arch_for_capability(major: int, minor: int) -> str:
    """Target arch string for a compute capability; arch-specific ('a') where features need it."""
    if (major, minor) < MIN_CAPABILITY:
        raise JitError(
            f"this GPU is sm_{major}{minor}, which has no FP8 tensor cores; the VC-Attention kernels need "
            "sm_89 or newer (Ada, Hopper, Blackwell): use backend='reference' here."
        )
    suffix = "a" if major in (9, 10, 12) and minor == 0 else ""
    return f"{major}.{minor}{suffix}"


def target_arch() -> str:
    """VC_ATTENTION_ARCH if set, else the current GPU's arch."""
    override = os.environ.get(ENV_PREFIX + "ARCH", "").strip()
    if override:
        if not re.fullmatch(r"\d+\.\d+a?", override):
            raise JitError(f"{ENV_PREFIX}ARCH={override!r} is not an arch like '9.0a', '8.9' or '12.0a'; fix or unset it.")
        return override
    check_torch_cuda()
    if not torch.cuda.is_available():
        raise JitError("no CUDA GPU is visible to PyTorch; run on a machine with an NVIDIA GPU (sm_89+) or set "
                       f"{ENV_PREFIX}ARCH to build for one.")
    return arch_for_capability(*torch.cuda.get_device_capability())


def arch_code(arch: str) -> str:
    """'9.0a' -> '90a'."""
    return arch.replace(".", "")


def gencode_flags(arch: str) -> list[str]:
    code = arch_code(arch)
    return [f"-gencode=arch=compute_{code},code=sm_{code}"]


# ----------------------------------------------------------------------------------------------
# cache
def cache_root() -> Path:
    override = os.environ.get(ENV_PREFIX + "CACHE_DIR")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vc_attention" / "jit"


def _header_files() -> list[Path]:
    return sorted(CSRC_DIR.glob("*.cuh")) + sorted(CSRC_DIR.glob("*.h"))


def source_hash(sources: list[Path], flags: list[str], arch: str) -> str:
    """Hash of every source and header byte, the flags and the arch."""
    digest = hashlib.sha256()
    for path in list(sources) + [h for h in _header_files() if h not in sources]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update("\0".join(flags).encode())
    digest.update(arch.encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class BuildSpec:
    """Everything that decides one build; `directory` is where it is cached."""

    name: str
    sources: tuple[Path, ...]
    cuda_flags: tuple[str, ...]
    cxx_flags: tuple[str, ...]
    arch: str

    @property
    def key(self) -> str:
        return source_hash(list(self.sources), list(self.cuda_flags) + ["|"] + list(self.cxx_flags), self.arch)

    @property
    def module_name(self) -> str:
        # unique per key, so two builds never clash inside one process
        return f"{self.name}_{self.key}"

    @property
    def directory(self) -> Path:
        cuda = (torch.version.cuda or "none").replace(".", "")
        torch_v = torch.__version__.split("+")[0]
        return cache_root() / f"{self.name}-v{pack_version()}-torch{torch_v}-cu{cuda}-sm{arch_code(self.arch)}-{self.key}"

    @property
    def library(self) -> Path:
        return self.directory / f"{self.module_name}.so"


def make_spec(name: str, sources, extra_cuda_cflags=(), extra_cflags=(), arch: str | None = None) -> BuildSpec:
    arch = arch or target_arch()
    srcs = tuple(Path(s) if Path(s).is_absolute() else CSRC_DIR / s for s in sources)
    cuda_flags = tuple(BASE_CUDA_FLAGS) + tuple(extra_cuda_cflags) + tuple(gencode_flags(arch))
    return BuildSpec(name, srcs, cuda_flags, tuple(BASE_CXX_FLAGS) + tuple(extra_cflags), arch)


if sys.platform == "win32":  # ComfyUI portable on Windows: msvcrt locks one byte, blocking retries
    import msvcrt

    def _lock(handle) -> None:
        while True:  # LK_LOCK gives up after about 10 s; a first build takes about a minute
            try:
                msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                return
            except OSError:
                continue

    def _unlock(handle) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock(handle) -> None:
        fcntl.flock(handle, fcntl.LOCK_EX)

    def _unlock(handle) -> None:
        fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def build_lock(directory: Path):
    """Exclusive lock on directory/.lock (blocks while another process builds)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        _lock(handle)
        try:
            yield
        finally:
            _unlock(handle)


def _import_library(spec: BuildSpec):
    import importlib.util

    module_spec = importlib.util.spec_from_file_location(spec.module_name, spec.library)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _compile(spec: BuildSpec, verbose: bool):
    from torch.utils import cpp_extension

    check_nvcc_version(nvcc_version(find_nvcc()), spec.arch)
    cuda_flags = list(spec.cuda_flags) + (["-Xptxas=-v"] if verbose else [])
    print(f"vc-attention: building {spec.name} for sm_{arch_code(spec.arch)} (first use; cached in {spec.directory})",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        module = cpp_extension.load(
            name=spec.module_name,
            sources=[str(s) for s in spec.sources],
            extra_cflags=list(spec.cxx_flags),
            extra_cuda_cflags=cuda_flags,
            extra_include_paths=[str(CSRC_DIR)],
            build_directory=str(spec.directory),
            verbose=verbose,
        )
    except RuntimeError as err:
        raise JitError(f"building {spec.name} for sm_{arch_code(spec.arch)} failed; compiler output follows.\n{err}") from err
    print(f"vc-attention: built {spec.name} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return module


def check_private(path: Path) -> None:
    """Refuse a cache entry another user could have written: a library planted there would run its
    constructor inside ComfyUI as soon as it is imported. Owned by this user (or root) and writable
    by nobody else, or a JitError that says why and what to do."""
    if sys.platform == "win32":
        return  # no POSIX owner and mode bits on Windows; the user profile's ACLs protect the default cache
    info = path.stat()
    if info.st_uid not in (os.getuid(), 0):
        raise JitError(
            f"the JIT cache entry {path} belongs to another user (uid {info.st_uid}), so a library in it may "
            f"not be ours; set {ENV_PREFIX}CACHE_DIR to a directory of your own."
        )
    if info.st_mode & 0o022:
        raise JitError(
            f"the JIT cache entry {path} is writable by other users (mode {info.st_mode & 0o777:o}), so a library "
            f"in it may not be ours; run `chmod go-w {path}` or set {ENV_PREFIX}CACHE_DIR to a private directory."
        )


def _make_private_dirs(spec: BuildSpec) -> None:
    """The cache root and the build directory, created without group/other write whatever the umask."""
    cache_root().mkdir(mode=0o755, parents=True, exist_ok=True)
    spec.directory.mkdir(mode=0o755, exist_ok=True)
    for path in (cache_root(), spec.directory):
        check_private(path)


def _load_or_build(spec: BuildSpec, verbose: bool):
    broken: Optional[ImportError] = None
    if spec.library.is_file():
        for path in (cache_root(), spec.directory, spec.library):
            check_private(path)
        try:
            return _import_library(spec)
        except ImportError as err:  # a truncated or corrupt file, e.g. from an interrupted build
            broken = err
    if env_flag("DISABLE_JIT"):
        state = f"cannot be loaded ({broken})" if broken else "is not in the cache"
        raise JitError(
            f"{ENV_PREFIX}DISABLE_JIT is set and {spec.name} for sm_{arch_code(spec.arch)} {state} "
            f"({spec.directory}); run `vc-attention build` once without it."
        )
    _make_private_dirs(spec)
    with build_lock(spec.directory):
        if spec.library.is_file():  # another process may have built (or rebuilt) it while we waited
            try:
                return _import_library(spec)
            except ImportError:
                spec.library.unlink()  # still the broken file: rebuild it
        return _compile(spec, verbose)


_LOADED: dict[str, object] = {}


def load_extension(name: str, sources, extra_cuda_cflags=(), extra_cflags=(), arch: str | None = None, verbose: bool | None = None):
    """Build (once, under a lock) and import a torch extension; returns the Python module.

    sources: file names in kernels/csrc/ (or absolute paths). Every .cuh in csrc/ is part of the
    cache key, so editing a header rebuilds. The module must define PYBIND11_MODULE(TORCH_EXTENSION_NAME, m).
    Every failure, a cache directory that cannot be used included, is a JitError (the node's counted
    `kernel_build_failed` fallback); a cached library that does not load is deleted and rebuilt.
    """
    check_torch_cuda()
    spec = make_spec(name, sources, extra_cuda_cflags, extra_cflags, arch)
    if str(spec.library) in _LOADED:
        return _LOADED[str(spec.library)]
    verbose = env_flag("VERBOSE") if verbose is None else verbose
    try:
        module = _load_or_build(spec, verbose)
    except OSError as err:  # a read-only cache, a file where a directory should be, a full disk
        raise JitError(
            f"the JIT cache {spec.directory} cannot be used ({err.strerror or err}); set "
            f"{ENV_PREFIX}CACHE_DIR to a writable directory of your own."
        ) from err
    _LOADED[str(spec.library)] = module
    return module


def nvcc_compile_only_command(source: Path, arch: str, output: Path, nvcc: str | None = None, extra_flags=()) -> list[str]:
    """nvcc command that compiles one torch-free .cu to a cubin with the build's flags (for tests);
    extra_flags: a build-time variant's -D flags, or -Xptxas=-v for the register report."""
    return [nvcc or find_nvcc(), "--cubin", "-std=c++17", *BASE_CUDA_FLAGS, *extra_flags, *gencode_flags(arch), f"-I{CSRC_DIR}",
            "-o", str(output), str(source)]
