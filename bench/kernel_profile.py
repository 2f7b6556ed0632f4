"""ncu side by side: our attention kernels against SageAttention 2.2's, one launch each, same inputs.

Time alone says who is faster; this says why (issue slots, stall reasons, occupancy, L2 traffic).
It re-runs itself under Nsight Compute, launches exactly one attention kernel per target inside the
profiled process, and turns ncu's CSV into one table (rows = metrics, columns = targets):

  python3 bench/kernel_profile.py --shape wan21-1.3b-480p \\
      --targets sa-portable,mma:wide:plain8,mma:wide:speed,mma:wide-coalesced:speed,sa-sm90,sm90:speed

Targets: `sa-portable` (SageAttention 2.2's mma.sync kernel, fp32+fp16, what RTX 40/50 users run),
`sa-sm90` (its Hopper kernel: `sageattn`), `mma:<variant>:<mode>` (our portable kernel, a build of
kernels/mma_variants.py), `sm90:<mode>` (our Hopper kernel); modes fidelity, speed, plain8 (sm90 also
fidelity-noterm / fidelity-nochord: the preset less one refinement). Only the attention kernels are profiled
(the kernel-name filter below): quantization and prepare are not.
Writes kernel_profile.json and the raw ncu CSV under --out (default $OUT or bench/results). GPU only;
needs `ncu` on PATH and, for the sa-* targets, `sageattention` importable.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from vc_attention.commands.bench import SHAPES  # `vc-attention bench`'s shapes, by the same names

# the attention kernels only: ours (portable 16-row and wide, Hopper) and SageAttention 2.2's
KERNELS = "regex:attn_mma_kernel|attn_mma_wide_kernel|vc_attention_sm90_kernel|qk_int_sv_f8_attn_kernel|qk_int8_sv_f8_attn_kernel"
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats", "ComputeWorkloadAnalysis",
            "MemoryWorkloadAnalysis", "InstructionStats")
# metric names as ncu's details page prints them (a name ncu does not print is left blank in the table)
TABLE = ("Duration", "Registers Per Thread", "Achieved Occupancy", "Executed Instructions", "Issue Slots Busy",
         "Issued Warp Per Scheduler", "Eligible Warps Per Scheduler", "Active Warps Per Scheduler",
         "Warp Cycles Per Issued Instruction", "Compute (SM) Throughput", "Memory Throughput", "L2 Hit Rate",
         "L1/TEX Hit Rate", "Executed Ipc Active")
# stall reasons: warp cycles spent stalled per issued instruction, by reason (what "latency-bound" consists of)
STALL_METRICS = r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")
# which pipe throttles (kernel-notes 46-47: the head-dim-64 chunk is pipe-bound on conversions and exponentials once
# latency is covered): each pipe's share of its peak issue rate while the SM is active
PIPE_METRICS = r"regex:sm__inst_executed_pipe_\w+\.avg\.pct_of_peak_sustained_active"
_PIPE = re.compile(r"sm__inst_executed_pipe_(\w+?)\.avg\.pct_of_peak_sustained_active")
MODES = ("fidelity", "speed", "plain8")  # bench/mma_variants.py's mode names (MODES there: name -> VCConfig)
# the Hopper library's refined fidelity kernels one refinement at a time, to see what each costs inside the kernel
# (kernel-notes 41): the preset without the V residual's second term (the chord alone), and without the chord
SM90_MODES = ("fidelity-noterm", "fidelity-nochord")


def sm90_config(mode: str):
    """An sm90 target's mode -> the configuration its launch runs."""
    from vc_attention.bench.mma_variants import MODES as configs
    from vc_attention.kernels.config import FIDELITY

    return {"fidelity-noterm": FIDELITY.with_(v_lo_channels=0),
            "fidelity-nochord": FIDELITY.with_(p="exp2")}.get(mode) or configs[mode]


def parse_target(text: str) -> tuple[str, str, str]:
    """'mma:wide:speed' -> ('mma', 'wide', 'speed'); 'sm90:speed' -> ('sm90', '', 'speed'); 'sa-portable' -> ('sa-portable', '', '')."""
    parts = text.split(":")
    if parts[0] in ("sa-portable", "sa-sm90") and len(parts) == 1:
        return parts[0], "", ""
    if parts[0] == "mma" and len(parts) == 3 and parts[2] in MODES:
        from vc_attention.kernels import mma_variants

        mma_variants.flags(parts[1])  # ValueError names the known variants
        return "mma", parts[1], parts[2]
    if parts[0] == "sm90" and len(parts) == 2 and parts[1] in MODES + SM90_MODES:
        return "sm90", "", parts[1]
    raise ValueError(f"unknown target {text!r}: sa-portable, sa-sm90, mma:<variant>:<mode> or sm90:<mode> "
                     f"(modes {', '.join(MODES)}; sm90 also {', '.join(SM90_MODES)})")


def launch_targets(shape: tuple[int, int, int, int], targets: list[str]) -> None:
    """In the profiled process: build everything first, then one attention launch per target, in order."""
    import torch

    from vc_attention.bench.mma_variants import MODES as configs
    from vc_attention.kernels import backend_mma, backend_sm90, mma_variants
    from vc_attention.kernels.prepare_cuda import prepare_cuda

    b, h, n, d = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    perm = torch.argsort(torch.rand(b, h, n, device="cuda", generator=gen), dim=-1).to(torch.int32)
    calls = []
    for text in targets:
        kind, variant, mode = parse_target(text)
        if kind.startswith("sa-"):
            import sageattention
            from sageattention.core import sageattn_qk_int8_pv_fp8_cuda

            fn = ((lambda: sageattn_qk_int8_pv_fp8_cuda(q, k, v, tensor_layout="HND", pv_accum_dtype="fp32+fp16"))
                  if kind == "sa-portable" else (lambda: sageattention.sageattn(q, k, v, tensor_layout="HND")))
        else:
            config = sm90_config(mode) if kind == "sm90" else configs[mode]
            ops = prepare_cuda(q, k, v, perm if config.v == "vsmooth" else None, config)
            out = torch.empty_like(q)
            if kind == "mma":
                flags = mma_variants.flags(variant)
                backend_mma.extension(flags)  # the JIT build happens here, not inside the profiled launch

                def fn(ops=ops, config=config, out=out, flags=flags):
                    backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=flags)
            else:
                backend_sm90.extension()

                def fn(ops=ops, config=config, out=out):
                    backend_sm90.attention_from_operands(ops, config, out, "bhnd")
        calls.append(fn)
    torch.cuda.synchronize()
    for fn in calls:  # one attention kernel each: ncu numbers its results in this order
        fn()
    torch.cuda.synchronize()


def parse_ncu_csv(text: str) -> list[dict[str, str]]:
    """ncu --csv --page details output -> one {metric name: 'value unit'} dict per profiled launch (in order)."""
    start = text.find('"ID"')
    if start < 0:
        return []
    launches: dict[str, dict[str, str]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        if not row.get("ID", "").isdigit() or row.get("Metric Name") is None:
            continue  # a line the profiled process printed between ncu's rows
        launch = launches.setdefault(row["ID"], {"Kernel Name": row.get("Kernel Name", "")})
        unit = row.get("Metric Unit") or ""
        launch[row["Metric Name"]] = f"{row['Metric Value']} {unit}".strip()
    return [launches[key] for key in sorted(launches, key=int)]


def _by_short_name(launch: dict[str, str], pattern: re.Pattern) -> dict[str, float]:
    """The launch's metrics whose full name `pattern` matches, by its first group, as numbers, largest first."""
    found = {}
    for name, value in launch.items():
        match = pattern.fullmatch(name)
        if match:
            found[match.group(1)] = float(value.split()[0].replace(",", ""))
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def stall_reasons(launch: dict[str, str]) -> dict[str, float]:
    """One launch's stall reasons (short name -> warp cycles per issued instruction), largest first."""
    return _by_short_name(launch, _STALL)


def pipe_use(launch: dict[str, str]) -> dict[str, float]:
    """One launch's pipe utilization (short pipe name -> % of its peak while active), largest first."""
    return _by_short_name(launch, _PIPE)


def ncu_and_out_dir(out: str) -> tuple[str, Path]:
    """ncu's path (a clear exit where it is not on PATH) and the output folder, created."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise SystemExit("ncu (Nsight Compute) is not on PATH")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    return ncu, out_dir


def profile(args) -> int:
    ncu, out_dir = ncu_and_out_dir(args.out)
    # application-only: the JIT builds in the profiled process start nvcc and ninja, which ncu need not follow
    cmd = [ncu, "--csv", "--page", "details", "--target-processes", "application-only", "--kernel-name", KERNELS,
           "--launch-count", str(len(args.targets)),
           *[x for s in SECTIONS for x in ("--section", s)], "--metrics", f"{STALL_METRICS},{PIPE_METRICS}",
           sys.executable, __file__, "--launch", "--shape", args.shape, "--targets", ",".join(args.targets)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), check=False)
    (out_dir / "kernel_profile_ncu.csv").write_text(done.stdout)
    (out_dir / "kernel_profile_ncu.log").write_text(done.stderr)
    launches = parse_ncu_csv(done.stdout)
    if done.returncode != 0 or len(launches) != len(args.targets):
        print(done.stderr[-3000:])
        raise SystemExit(f"ncu exit {done.returncode}, {len(launches)} kernels profiled for {len(args.targets)} targets "
                         f"(raw output in {out_dir})")
    result = dict(shape=args.shape, dims=SHAPES[args.shape], command=" ".join(sys.argv), sections=list(SECTIONS),
                  targets={t: m for t, m in zip(args.targets, launches)})
    (out_dir / "kernel_profile.json").write_text(json.dumps(result, indent=1))
    width = max(12, *(len(t) for t in args.targets))
    print(f"{args.shape} {SHAPES[args.shape]}")
    print(f"{'metric':36s} " + " ".join(f"{t:>{width}s}" for t in args.targets))
    for name in TABLE:
        print(f"{name:36s} " + " ".join(f"{m.get(name, ''):>{width}s}" for m in launches))
    stalls = [stall_reasons(m) for m in launches]
    top = sorted({r for st in stalls for r in list(st)[:6]}, key=lambda r: -max(st.get(r, 0.0) for st in stalls))
    for reason in top:  # the six largest of each target, as cycles per issued instruction
        print(f"{'stall: ' + reason:36s} " + " ".join(f"{st.get(reason, 0.0):>{width}.2f}" for st in stalls))
    pipes = [pipe_use(m) for m in launches]
    busiest = sorted({r for pu in pipes for r in list(pu)[:5]}, key=lambda r: -max(pu.get(r, 0.0) for pu in pipes))
    for pipe in busiest:  # the five busiest of each target, % of peak
        print(f"{'pipe %: ' + pipe:36s} " + " ".join(f"{pu.get(pipe, 0.0):>{width}.1f}" for pu in pipes))
    print("kernels: " + "; ".join(f"{t} = {m['Kernel Name'][:60]}" for t, m in zip(args.targets, launches)))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="wan21-1.3b-480p", choices=sorted(SHAPES))
    parser.add_argument("--targets", default="sa-portable,mma:wide:plain8,mma:wide:speed,sa-sm90,sm90:speed",
                        help="comma-separated: sa-portable, sa-sm90, mma:<variant>:<mode>, sm90:<mode>")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--launch", action="store_true", help=argparse.SUPPRESS)  # the process ncu profiles
    args = parser.parse_args(argv)
    args.targets = [t for t in args.targets.split(",") if t]
    for target in args.targets:
        try:
            parse_target(target)
        except ValueError as err:
            parser.error(str(err))
    if args.launch:
        launch_targets(SHAPES[args.shape], args.targets)
        return 0
    return profile(args)


if __name__ == "__main__":
    raise SystemExit(main())
