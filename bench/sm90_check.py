"""Timing and SASS of prebuilt variants of the Hopper (sm_90a) kernel, each gated against reference.py.

Runs the kernel through its torch-free C entry point (ctypes) from one or more prebuilt shared
libraries (variants built with different -D flags), so one device call can compare variants side by
side. A variant library is outside the JIT, so its quick correctness gate lives here; the JIT-built
backends are tested by `pytest -q -m gpu` (tests/test_backends_gpu.py). Operands come from
kernels.prepare_reference (the contract's defining values). Build a variant with the JIT's flags,
which include the shared constants (kernels/constants.py, `constants.cuda_defines()`).

  python bench/sm90_check.py --lib build/sm90_base.so [--lib build/sm90_x.so ...] [--out DIR]
  bash bench/sm90_variants.sh   # builds the compile-time variants and runs this on all of them

Prints a short table last and writes sm90_check.json (and the SASS summary) under --out.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.kernels import FIDELITY as FIDELITY_PRESET, PLAIN_8BIT, SPEED, reference

# the variant libraries' fidelity: the preset without its refinements (the mixed encoding, the V residual's second
# term), which a variant build adds through its own flags (VC_SM90_EXP2_CHORD_EIGHTHS, VC_SM90_V_LO: Sm90Library.spec)
FIDELITY = FIDELITY_PRESET.without_refinements()

# fidelity's exp2 with 256-row means merged into segments: the exp2 one-mean loop of VC_SM90_STEPMEAN_EXP2
# builds (split_f256), the two-mean fold elsewhere
FIDELITY_256 = FIDELITY.with_(v_mean_rows=256, v_mean_merge=True)
# fidelity with one K scale per 128 keys (a custom configuration; config.FIDELITY pairs them): the exp2 loop that
# reads each tile's scale, in every build
FIDELITY_K128 = FIDELITY.with_(k_scale_rows=128)
from vc_attention.kernels.layout import from_bhnd
from vc_attention.kernels.prepare_reference import prepare_reference
from vc_attention.kernels.backend_sm90 import vsmooth_mode  # 2: the means equal in pairs (v_mean_rows 256)

WAN_SHAPE = (1, 40, 75600, 128)


class Sm90Library:
    """ctypes view of vc_sm90_forward in one prebuilt variant."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.stem
        self.lib = ctypes.CDLL(str(path))
        f = self.lib.vc_sm90_forward
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_int] * 5 + [ctypes.c_longlong] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p]
        self.lib.vc_sm90_last_error.restype = ctypes.c_char_p
        # VC_SM90_EXP2_CHORD_EIGHTHS builds: their exp2 kernels run the mixed encoding (reference p="mixed")
        eighths = getattr(self.lib, "vc_sm90_chord_eighths", None)
        self.chord_eighths = int(eighths()) if eighths is not None else 0
        # VC_SM90_V_LO builds: fidelity's paired-K exp2 kernel takes the V residual's second term (v_lo_channels)
        lo = getattr(self.lib, "vc_sm90_v_lo_channels", None)
        self.v_lo_channels = int(lo()) if lo is not None else 0
        self.forward_v_lo = getattr(self.lib, "vc_sm90_forward_v_lo", None) if self.v_lo_channels else None
        if self.forward_v_lo is not None:
            self.forward_v_lo.restype = ctypes.c_int
            self.forward_v_lo.argtypes = ([ctypes.c_void_p] * 10 + [ctypes.c_int] * 5 + [ctypes.c_longlong] * 3
                                          + [ctypes.c_int] * 3 + [ctypes.c_void_p])
        # the forward with the low-rank V term (libraries built before it existed have none)
        self.low_rank = getattr(self.lib, "vc_sm90_forward_low_rank", None)
        if self.low_rank is not None:
            self.low_rank.restype = ctypes.c_int
            self.low_rank.argtypes = ([ctypes.c_void_p] * 10 + [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 5
                                      + [ctypes.c_longlong] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p])

    def step_keys(self, d: int, config) -> int:
        """Keys per online-softmax step of the kernel this library runs for (d, config): its emulation's
        offset_block (vc_sm90_step_keys; libraries built before it existed step by one 128-key tile)."""
        f = getattr(self.lib, "vc_sm90_step_keys", None)
        return f(d, int(config.p == "expcast"), int(config.v == "vsmooth")) if f else reference.K_BLOCK

    def runs(self, d: int, config) -> bool:
        """False where this library's kernel for (d, config) takes one K scale per 256-key step but the
        configuration's K scales are per 128 keys (vc_sm90_k_pairs; libraries built before it pair only
        where the speed loop's configuration does)."""
        f = getattr(self.lib, "vc_sm90_k_pairs", None)
        if f is None or config.v != "vsmooth":
            return True
        return not f(d, int(config.p == "expcast"), vsmooth_mode(config, d)) or reference.k_scale_rows(config, d) == 256

    def spec(self, config, d: int = 128):
        """The configuration this library's kernel for (d, `config`) implements: p="mixed" where its exp2 kernels
        take the chord for part of every step (the reference then needs chord_eighths=self.chord_eighths), and
        v_lo_channels where fidelity's paired-K exp2 kernel takes the residual's second term (VC_SM90_V_LO: head dim
        128, V-Smooth, exp2 P, K scales per 256 keys, no low-rank term)."""
        if self.chord_eighths and config.p == "exp2":
            config = config.with_(p="mixed")
        if (self.v_lo_channels and d == 128 and config.v == "vsmooth" and config.p in ("exp2", "mixed")
                and not config.v_rank and reference.k_scale_rows(config, d) == 2 * reference.K_BLOCK):
            config = config.with_(v_lo_channels=self.v_lo_channels)
        return config

    def operand_config(self, config, d: int = 128):
        """The configuration whose operands this library's kernel for (d, `config`) reads: spec's but for the P
        encoding, which changes no operand (the second V term does)."""
        return self.spec(config, d).with_(p=config.p)

    def run(self, ops, out: torch.Tensor, layout: str, config) -> None:
        b, h, n_pad, d = ops.q_q.shape
        sb, sh, sn = (out.stride(0), out.stride(1), out.stride(2)) if layout == "bhnd" else (out.stride(0), out.stride(2), out.stride(1))
        if ops.v_low_t is not None:
            if self.low_rank is None:
                raise RuntimeError(f"{self.name}: this library has no low-rank V forward")
            rc = self.low_rank(
                ops.q_q.data_ptr(), ops.q_scale.data_ptr(), ops.k_q.data_ptr(), ops.k_scale.data_ptr(), ops.v_t.data_ptr(),
                ops.v_scale.data_ptr(), ops.v_mean.data_ptr(), ops.v_low_t.data_ptr(), ops.v_low_basis.data_ptr(),
                ops.v_low_scale.data_ptr(), ops.v_low_scale.shape[-1], out.data_ptr(), b, h, ops.n_tokens, n_pad, d,
                sb, sh, sn, int(config.p == "expcast"), 1, int(out.dtype == torch.bfloat16),
                torch.cuda.current_stream().cuda_stream)
            if rc:
                raise RuntimeError(f"{self.name}: {self.lib.vc_sm90_last_error().decode()}")
            return
        if ops.v_lo_t is not None:  # the residual's second term (a VC_SM90_V_LO library)
            if self.forward_v_lo is None:
                raise RuntimeError(f"{self.name}: this library has no forward with the V residual's second term")
            rc = self.forward_v_lo(
                ops.q_q.data_ptr(), ops.q_scale.data_ptr(), ops.k_q.data_ptr(), ops.k_scale.data_ptr(), ops.v_t.data_ptr(),
                ops.v_scale.data_ptr(), ops.v_mean.data_ptr(), ops.v_lo_t.data_ptr(), ops.v_lo_sel.data_ptr(),
                out.data_ptr(), b, h, ops.n_tokens, n_pad, d, sb, sh, sn, int(config.p == "expcast"),
                vsmooth_mode(config, d), int(out.dtype == torch.bfloat16), torch.cuda.current_stream().cuda_stream)
            if rc:
                raise RuntimeError(f"{self.name}: {self.lib.vc_sm90_last_error().decode()}")
            return
        rc = self.lib.vc_sm90_forward(
            ops.q_q.data_ptr(), ops.q_scale.data_ptr(), ops.k_q.data_ptr(), ops.k_scale.data_ptr(), ops.v_t.data_ptr(),
            ops.v_scale.data_ptr(), ops.v_mean.data_ptr(), out.data_ptr(), b, h, ops.n_tokens, n_pad, d, sb, sh, sn,
            int(config.p == "expcast"), vsmooth_mode(config, d), int(out.dtype == torch.bfloat16), torch.cuda.current_stream().cuda_stream,
        )
        if rc:
            raise RuntimeError(f"{self.name}: {self.lib.vc_sm90_last_error().decode()}")


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def make_inputs(b, h, n, d, dtype, layout, seed, video_like=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, h, n, d) if layout == "bhnd" else (b, n, h, d)
    q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) for _ in range(3))
    if video_like:  # smooth token drift + channel outliers, the case V-Smooth is for
        k = k + 3.0 * torch.randn((1, 1, 1, d) if layout == "bhnd" else (1, 1, 1, d), generator=g, device="cuda")
        v = v * (1 + 4 * (torch.rand(d, generator=g, device="cuda") > 0.95)) + 2.0
    return q.to(dtype), k.to(dtype), v.to(dtype)


def two_scale_blocks(b, h, n, d, dtype, seed):
    """(B,H,N,D) inputs whose adjacent 128-key K-scale blocks differ ~9x in scale: per 256 keys a key at
    ~20 log2 units in the first block, one at ~18 plus an outlier ~9x larger, orthogonal to the queries,
    in the second (a 256-key softmax step anchored at the step's max overflows its row constant here)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    u = torch.nn.functional.normalize(torch.randn(d, generator=g, device="cuda"), dim=0)
    w = torch.randn(d, generator=g, device="cuda")
    w = torch.nn.functional.normalize(w - (w @ u) * u, dim=0)
    q = 3.0 * u + 0.05 * torch.randn(b, h, n, d, generator=g, device="cuda")
    k = 0.3 * torch.randn(b, h, n, d, generator=g, device="cuda")
    c = 20.0 / (3.0 / d**0.5 * reference.LOG2E)  # key c u scores ~20 log2 units
    for start in range(0, n - 168, 256):
        k[:, :, start + 17] = c * u
        k[:, :, start + 128 + 5] = 0.9 * c * u
        k[:, :, start + 128 + 40] = 12.0 * c * w
    v = torch.randn(b, h, n, d, generator=g, device="cuda")
    return q.to(dtype), k.to(dtype), v.to(dtype)


def check_case(lib, config, b, h, n, d, dtype, layout, seed, scale_blocks=False):
    if scale_blocks:
        q, k, v = (t if layout == "bhnd" else t.transpose(1, 2).contiguous() for t in two_scale_blocks(b, h, n, d, dtype, seed))
    else:
        q, k, v = make_inputs(b, h, n, d, dtype, layout, seed, video_like=(seed % 2 == 1))
    perm = torch.stack([torch.randperm(n, device="cuda") for _ in range(b * h)]).view(b, h, n) if config.v == "vsmooth" else None
    if scale_blocks and perm is not None:  # keep the blocks' layout: the identity grouping
        perm = torch.arange(n, device="cuda").expand(b, h, n).contiguous()
    spec = lib.spec(config, d)  # the operands of what this library's kernel implements (the second V term's rows)
    ops = prepare_reference(q, k, v, perm, spec, layout)
    out = torch.full_like(q, float("nan"))
    lib.run(ops, out, layout, spec)
    torch.cuda.synchronize()
    step = lib.step_keys(d, config)  # the variant's online-softmax step for this case

    def emulated(spec):
        return from_bhnd(reference.vc_attention_reference(q, k, v, spec, layout=layout, perm=perm, parts=True,
                                                          offset_block=step, chord_eighths=lib.chord_eighths or reference.MIXED_CHORD_EIGHTHS).out,
                         layout)

    ref = emulated(spec)
    # rel-L2 against the float64 emulation; the output dtype's own rounding is the floor under it
    floor = rel_l2(ref.to(out.dtype), ref)
    # a mixed library is also measured against the all-exp2 spec: its distance to the mixed spec must be the smaller
    # (the gate alone, floor + 1e-3, would pass either encoding)
    other = rel_l2(out, emulated(config)) if spec != config else None
    return rel_l2(out, ref), floor, bool(torch.isfinite(out).all()), other


def correctness(lib):
    cases = []
    for config in (FIDELITY, FIDELITY_256, FIDELITY_K128, SPEED, PLAIN_8BIT):
        for (b, h, n, d, dtype, layout) in (
            (2, 3, 77, 128, torch.bfloat16, "bhnd"),
            (2, 3, 129, 64, torch.float16, "bnhd"),
            (2, 2, 1000, 128, torch.float16, "bnhd"),
            (2, 2, 4097, 64, torch.bfloat16, "bhnd"),
            (1, 2, 4097, 128, torch.bfloat16, "bnhd"),
        ):
            if not lib.runs(d, config):  # a K-pairing build: its fidelity kernel needs paired K scales
                continue
            err, floor, finite, other = check_case(lib, config, b, h, n, d, dtype, layout, seed=len(cases))
            cases.append(dict(config=lib.spec(config, d).tag, shape=[b, h, n, d], dtype=str(dtype), layout=layout,
                              rel_l2=err, dtype_floor=floor, finite=finite, rel_l2_vs_exp2_spec=other,
                              ok=finite and err <= floor + 1e-3 and (other is None or err < other)))
        # K-scale blocks ~9x apart next to each other (the 256-key step's anchor case)
        if not lib.runs(128, config):
            continue
        err, floor, finite, other = check_case(lib, config, 1, 2, 1000, 128, torch.bfloat16, "bhnd", seed=len(cases),
                                               scale_blocks=True)
        cases.append(dict(config=lib.spec(config, 128).tag, shape=[1, 2, 1000, 128], dtype="torch.bfloat16", layout="bhnd",
                          data="two-scale-blocks", rel_l2=err, dtype_floor=floor, finite=finite, rel_l2_vs_exp2_spec=other,
                          ok=finite and err <= floor + 1e-3 and (other is None or err < other)))
    return cases


def _fused_prepare():
    """The fused CUDA prepare extension when it builds here, else the torch reference."""
    try:
        from vc_attention.kernels import prepare_cuda

        prepare_cuda.extension()
        return prepare_cuda.prepare_cuda
    except (ImportError, RuntimeError) as err:
        print(f"fused prepare unavailable ({err}); timing the kernel only", flush=True)
        return prepare_reference


def _sageattention():
    """SageAttention's sageattn when installed (the issue's second baseline), else None."""
    try:
        from sageattention import sageattn
    except ImportError:
        return None
    return sageattn


def timing(libs, shape, iters, fused_prepare=True, rank=0):
    b, h, n, d = shape
    flops = 4.0 * b * h * n * n * d
    q, k, v = make_inputs(b, h, n, d, torch.bfloat16, "bhnd", seed=1234)
    rows = []
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ms = cuda_time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), iters, warmup=3)
    rows.append(dict(method="sdpa-cudnn-bf16", ms=ms, tflops=flops / ms / 1e9))
    base = ms
    sage = _sageattention()
    sage_ms = None
    if sage is not None:
        sage_ms = cuda_time_ms(lambda: sage(q, k, v, tensor_layout="HND"), iters, warmup=3)
        rows.append(dict(method="sageattention", ms=sage_ms, tflops=flops / sage_ms / 1e9, speedup=base / sage_ms))
    perm = torch.argsort(torch.rand(b, h, n, device="cuda"), dim=-1)  # grouping itself is excluded
    prepare = _fused_prepare() if fused_prepare else prepare_reference
    # rank: V-Smooth with the low-rank V term (head dim 128: the LOWRANK kernels); the basis of the spec
    with_rank = [c.with_rank(rank) if rank and d == 128 else c for c in (SPEED, FIDELITY)] + ([] if rank else [FIDELITY_256, FIDELITY_K128])
    for config in (*with_rank, PLAIN_8BIT):
        p = perm if config.v == "vsmooth" else None
        ops = prepare(q, k, v, p, config)
        prep_ms = float("nan")  # the reference prepare is not a kernel: not timed
        if prepare is not prepare_reference:
            prep_ms = cuda_time_ms(lambda: prepare(q, k, v, p, config), iters, warmup=3)
        out = torch.empty_like(q)
        spec_ops = {config.tag: ops}  # a library whose kernel implements another spec (the second V term) gets its own
        for lib in libs:
            if not lib.runs(d, config):
                continue
            spec, operands = lib.spec(config, d), lib.operand_config(config, d)
            if operands.tag not in spec_ops:  # the fused prepare has no second V term: the reference's operands
                spec_ops[operands.tag] = prepare_reference(q, k, v, p, operands)
            ops_l = spec_ops[operands.tag]
            ms = cuda_time_ms(lambda: lib.run(ops_l, out, "bhnd", spec), iters, warmup=3)
            rows.append(dict(method=f"{lib.name}:{config.tag} kernel", ms=ms, tflops=flops / ms / 1e9, speedup=base / ms,
                             vs_sage=None if sage_ms is None else sage_ms / ms))
            if prepare is prepare_reference or operands != config:  # (its prepare is not the timed one)
                continue
            total = ms + prep_ms
            rows.append(dict(method=f"{lib.name}:{config.tag} +prepare", ms=total, tflops=flops / total / 1e9,
                             speedup=base / total, prepare_ms=prep_ms,
                             vs_sage=None if sage_ms is None else sage_ms / total))
        del ops, spec_ops
        torch.cuda.empty_cache()
    return rows


def sass_summary(libs, out_dir: Path):
    summary = {}
    for lib in libs:
        try:
            sass = subprocess.run(["cuobjdump", "--dump-sass", str(lib.path)], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as err:
            summary[lib.name] = f"cuobjdump failed: {err}"
            continue
        (out_dir / f"{lib.name}.sass").write_text(sass)
        per_fn = {}
        for block in re.split(r"\n\s*Function : ", sass)[1:]:
            name = block.split("\n", 1)[0].strip()
            flags = re.findall(r"Lb([01])E", name)
            tag = ("d128" if "ILi128E" in name else "d64") + ("-expcast" if flags[0] == "1" else "-exp2") + ("-vsmooth" if flags[1] == "1" else "-perchannel") + ("-bf16" if "bfloat16" in name else "-fp16")
            per_fn[tag] = {op: len(re.findall(op, block)) for op in ("MUFU.EX2", "F2I", "I2F", "F2FP", "QGMMA", "IGMMA", "HGMMA", "LDL", "STL", "PRMT", "SHFL")}
        summary[lib.name] = per_fn
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", action="append", required=True, help="prebuilt variant library (repeatable)")
    parser.add_argument("--out", default="out", help="folder for sm90_check.json and SASS dumps")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--shape", action="append", default=None,
                        help="B,H,N,D timing shape (repeatable; default the Wan2.2-14B 720p shape)")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--no-prepare", action="store_true",
                        help="time the kernel only (operands from the torch reference prepare; no extension build)")
    parser.add_argument("--rank", type=int, default=0, help="time V-Smooth with this low-rank V term (head dim 128)")
    parser.add_argument("--profile-once", choices=["speed", "fidelity"],
                        help="only launch the first --lib twice at (1, 8, 32768, 128) in this mode (run under ncu)")
    args = parser.parse_args()
    if args.profile_once:
        lib = Sm90Library(Path(args.lib[0]).resolve())
        config = (SPEED if args.profile_once == "speed" else FIDELITY).with_rank(args.rank)
        q, k, v = make_inputs(1, 8, 32768, 128, torch.bfloat16, "bhnd", seed=5)
        ops = prepare_reference(q, k, v, torch.argsort(torch.rand(1, 8, 32768, device="cuda"), dim=-1), config)
        out = torch.empty_like(q)
        for _ in range(2):
            lib.run(ops, out, "bhnd", config)
        torch.cuda.synchronize()
        return 0
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    libs = [Sm90Library(Path(p).resolve()) for p in args.lib]
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda, variants={})
    for lib in [] if args.skip_correctness else libs:
        t0 = time.time()
        cases = correctness(lib)
        result["variants"][lib.name] = dict(correctness=cases, check_s=time.time() - t0)
        worst = max(c["rel_l2"] - c["dtype_floor"] for c in cases)
        bad = [c for c in cases if not c["ok"]]
        print(f"[{lib.name}] correctness: {len(cases) - len(bad)}/{len(cases)} ok, worst rel-L2 above the dtype floor {worst:.2e}", flush=True)
        for c in bad:
            print("   FAIL", c, flush=True)
    result["sass"] = sass_summary(libs, out_dir)
    print(json.dumps(result["sass"], indent=1), flush=True)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] if args.shape else [WAN_SHAPE]
    if not args.skip_timing:
        result["timing"] = {str(shape): timing(libs, shape, args.iters, not args.no_prepare, args.rank) for shape in shapes}
    (out_dir / "sm90_check.json").write_text(json.dumps(result, indent=1))
    print(f"\nGPU {result['gpu']}, torch {result['torch']}, CUDA {result['cuda']}; bf16 in, median of {args.iters}")
    for shape, rows in result.get("timing", {}).items():
        print(f"shape (B,H,N,D) = {shape}")
        for r in rows:
            vs_sage = f"  {r['vs_sage']:5.2f}x SA" if r.get("vs_sage") is not None else ""
            print(f"  {r['method']:<48} {r['ms']:8.2f} ms {r['tflops']:7.1f} TFLOPS-eq  {r.get('speedup', 1.0):5.2f}x{vs_sage}")
    if len(libs) > 1 and "timing" in result:
        print(compact_table(result["timing"], [lib.name for lib in libs]))
    return 0


def compact_table(timing: dict, names: list) -> str:
    """One line per variant and shape: kernel ms per mode, with the ratio to cuDNN (and SageAttention)."""
    lines = ["\nvariants, kernel ms (x cuDNN / x SageAttention):"]
    for shape, rows in timing.items():
        by_method = {r["method"]: r for r in rows}
        ref = by_method["sdpa-cudnn-bf16"]["ms"]
        sage = by_method.get("sageattention", {}).get("ms")
        lines.append(f"{shape}: cuDNN {ref:.2f} ms" + (f", SageAttention {sage:.2f} ms" if sage else ""))
        for name in names:
            cells = []
            tags = {r["method"].split(":")[1].rsplit(" ", 1)[0] for r in rows if r["method"].startswith(f"{name}:")}
            for tag in sorted(tags, key=lambda t: ("expcast" not in t, "per_channel" in t)):
                r = by_method.get(f"{name}:{tag} kernel")
                if r is None:
                    continue
                cells.append(f"{tag} {r['ms']:7.2f} ({ref / r['ms']:.2f}x" + (f" / {sage / r['ms']:.2f}x)" if sage else ")"))
            lines.append(f"  {name:<24} " + "  ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
