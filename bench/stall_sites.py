"""Where the warps wait: ncu's PC-sampling stall counts per SASS instruction, ours beside SageAttention 2.2's.

kernel_profile.py says how much a kernel stalls and on what (the `wait` stall leads our head-dim-64 portable kernel,
docs/kernel-notes.md 48); this says at which instructions, which is what a latency fix has to move. It profiles one
attention launch per target (kernel_profile.py's targets and launcher; one ncu run per target) with ncu's
SourceCounters section, exports the source page as SASS, and keeps per target: the samples by stall reason, by opcode,
and the instructions holding the most samples with their top reasons (`--top`), each with the instructions just before
it (the producers a fixed-latency `wait` points at are usually there).

  python3 bench/stall_sites.py --shape d64 --targets sa-portable,mma:<variant>:plain8,mma:<variant>:fidelity

Writes stall_sites.json under --out (default $OUT or bench/results; with the raw source CSV, gzipped, under
--keep-csv or where its parsing failed). GPU only; needs `ncu`.
The CSV parsing is here and tested on the CPU (tests/test_stall_sites.py).
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from vc_attention.bench import kernel_profile
from vc_attention.commands.bench import SHAPES

CONTEXT = 4  # instructions kept before each top site


def _number(text: str) -> float:
    try:
        return float(text.replace(",", "").strip() or 0)
    except ValueError:
        return 0.0


def _is_header(row: list[str]) -> bool:
    return "Source" in row and any("Samples" in cell for cell in row)


def parse_source_csv(text: str) -> list[dict]:
    """ncu --page source --csv --print-source sass -> one block per profiled kernel, in ncu's order:
    {"kernel": the line(s) ncu printed before the block's header, or its Kernel Name column where one
    table holds every kernel, "rows": [{"kernel", "address", "sass", "samples", "executed", "stalls": {reason:
    samples}}]}. The sample column is "Warp Stall Sampling (All Samples)" (or the first column naming samples);
    reasons are the columns named stall_*."""
    blocks: list[dict] = []
    header: list[str] = []
    context: list[str] = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not any(cell.strip() for cell in row):
            continue
        if _is_header(row):
            header = row
            blocks.append({"kernel": " ".join(context).strip(), "rows": []})
            context = []
            # the header's columns, once per block
            sample_col = next((h for h in header if h.startswith("Warp Stall Sampling (All")), None) or next(
                h for h in header if "Samples" in h)
            executed_col = "Instructions Executed" if "Instructions Executed" in header else None
            name_col = "Kernel Name" if "Kernel Name" in header else None
            reason_cols = [h for h in header if h.startswith("stall_")]
            continue
        if not header or len(row) != len(header):
            context.append(" ".join(cell for cell in row if cell.strip()))  # a kernel's title line before its header
            if len(context) > 3:
                context = context[-3:]
            continue
        cells = dict(zip(header, row))
        if name_col and blocks[-1]["rows"] and cells[name_col] != blocks[-1]["rows"][-1]["kernel"]:
            blocks.append({"kernel": cells[name_col], "rows": []})  # one table for all kernels: split where it changes
        elif name_col and not blocks[-1]["rows"]:
            blocks[-1]["kernel"] = cells[name_col]
        blocks[-1]["rows"].append({
            "kernel": cells[name_col] if name_col else blocks[-1]["kernel"],
            "address": cells.get("Address", "").strip(),
            "sass": cells["Source"].strip(),
            "samples": _number(cells[sample_col]),
            "executed": _number(cells[executed_col]) if executed_col else 0.0,
            "stalls": {h[len("stall_"):]: _number(cells[h]) for h in reason_cols if _number(cells[h])},
        })
    return blocks


def opcode(sass: str) -> str:
    """'@!P0 IMAD.WIDE R2, R3, ...' -> 'IMAD' (predicate and modifiers dropped)."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def summarize(block: dict, top: int) -> dict:
    """One kernel's sampling: totals, by reason, by opcode, and the `top` instructions with their context."""
    rows = block["rows"]
    total = sum(r["samples"] for r in rows)
    reasons: collections.Counter = collections.Counter()
    opcodes: collections.Counter = collections.Counter()
    for r in rows:
        reasons.update(r["stalls"])
        opcodes[opcode(r["sass"])] += r["samples"]
    order = sorted(range(len(rows)), key=lambda i: -rows[i]["samples"])[:top]
    sites = []
    for i in order:
        r = rows[i]
        sites.append({
            "address": r["address"], "sass": r["sass"], "samples": r["samples"],
            "share": r["samples"] / total if total else 0.0,
            "reasons": dict(collections.Counter(r["stalls"]).most_common(3)),
            "before": [rows[j]["sass"] for j in range(max(0, i - CONTEXT), i)],
        })
    return {"kernel": block["kernel"], "instructions": len(rows), "samples": total,
            "by_reason": dict(reasons.most_common()), "by_opcode": dict(opcodes.most_common(20)), "top": sites}


def sample_one(ncu: str, out_dir: Path, shape: str, target: str, keep_csv: bool) -> dict:
    """One target in its own ncu run (one kernel per report, so no block of the source page can land under another
    target's name): its source block, parsed. The report (large) stays on the machine, outside out_dir; the raw CSV
    (gzipped) and ncu's log come back only under keep_csv or where something failed (a device call returns at most
    8 files)."""
    tag = re.sub(r"[^\w.-]+", "_", target)[-80:]
    report = Path(tempfile.mkdtemp(prefix="vc_stall_sites_")) / "report"
    cmd = [ncu, "-f", "-o", str(report), "--target-processes", "application-only", "--kernel-name", kernel_profile.KERNELS,
           "--launch-count", "1", "--section", "SourceCounters", "--section", "WarpStateStats", "--import-source", "no",
           sys.executable, kernel_profile.__file__, "--launch", "--shape", shape, "--targets", target]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), check=False)
    if done.returncode != 0:
        (out_dir / f"stall_sites_ncu_{tag}.log").write_text(done.stdout + done.stderr)
        print(done.stderr[-3000:])
        raise SystemExit(f"ncu exit {done.returncode} on {target} (log in {out_dir})")
    source = subprocess.run([ncu, "--import", f"{report}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                            capture_output=True, text=True, check=False)
    blocks = [b for b in parse_source_csv(source.stdout) if b["rows"]]
    if keep_csv or source.returncode != 0 or len(blocks) != 1:
        with gzip.open(out_dir / f"stall_sites_source_{tag}.csv.gz", "wt") as raw:
            raw.write(source.stdout)
    if source.returncode != 0 or len(blocks) != 1:
        print(source.stderr[-3000:])
        raise SystemExit(f"ncu --import exit {source.returncode}: {len(blocks)} source blocks for {target}, expected one "
                         f"(raw CSV in {out_dir})")
    return blocks[0]


def profile(args) -> int:
    ncu, out_dir = kernel_profile.ncu_and_out_dir(args.out)
    blocks = [sample_one(ncu, out_dir, args.shape, t, args.keep_csv) for t in args.targets]
    result = dict(shape=args.shape, dims=SHAPES[args.shape], command=" ".join(sys.argv),
                  targets={t: summarize(b, args.top) for t, b in zip(args.targets, blocks)})
    (out_dir / "stall_sites.json").write_text(json.dumps(result, indent=1))
    for target, s in result["targets"].items():
        reasons = ", ".join(f"{k} {v / s['samples']:.0%}" for k, v in list(s["by_reason"].items())[:5]) if s["samples"] else ""
        print(f"== {target}: {s['samples']:.0f} samples over {s['instructions']} instructions; {reasons}")
        for site in s["top"][:10]:
            why = ", ".join(f"{k} {v:.0f}" for k, v in site["reasons"].items())
            print(f"  {site['share']:6.1%}  {site['address']:>6s}  {site['sass'][:60]:60s} {why}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="d64", choices=sorted(SHAPES))
    parser.add_argument("--targets", required=True, help="comma-separated, as bench/kernel_profile.py's")
    parser.add_argument("--top", type=int, default=40, help="instructions kept per target, most samples first")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--keep-csv", action="store_true", help="also write ncu's source pages (stall_sites_source_*.csv.gz)")
    args = parser.parse_args(argv)
    args.targets = [t for t in args.targets.split(",") if t]
    for target in args.targets:
        try:
            kernel_profile.parse_target(target)
        except ValueError as err:
            parser.error(str(err))
    if args.top < 1:
        parser.error("--top must be at least 1")
    return profile(args)


if __name__ == "__main__":
    raise SystemExit(main())
