"""Where a kernel's warps wait: ncu's per-instruction warp-state samples summed by opcode, by stall
reason and by source region (the function or lambda that emitted the instruction).

The attention kernels are latency-bound (docs/kernel-notes.md sections 14 and 20: issue slots and the
tensor pipe both about half busy), so the question for the next variant is which instructions a warp
waits on, not which pipe is full. ncu samples each warp's program counter and state; its source page
lists the samples per SASS instruction. The regions come from the same cubin's line table (nvdisasm
-gi, compiled with -lineinfo as every build here is), whose innermost location names the device
function or lambda and whose outermost one in the kernel file names the loop position.

  GPU (bench/sm90_variants.sh with SM90_NCU_SOURCE=1 does these two and keeps the CSV):
    ncu --set full --import-source no -k regex:vc_attention_sm90 -c 1 -o REP python3 bench/sm90_check.py ...
    ncu -i REP.ncu-rep --page source --csv --print-source sass > REP.csv
  anywhere (the library's cubin, built with the same flags: `nvcc -cubin ...`, see sm90_variants.sh):
    nvdisasm -c -gi k.cubin > k.sass
    python3 bench/sass_stalls.py REP.csv[.gz] [--sass k.sass --kernel SUBSTRING] [--top 30] [--json OUT]

Without --sass the regions are left out; the opcode, reason and hottest-instruction tables need only
the CSV. The CSV's column names differ between ncu versions: the address, source and sample columns
are found by name (see `_columns`), and a CSV without them is an error that lists its header.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_LOC = re.compile(r'File "([^"]+)", line (\d+)')
_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_FUNC_HEADER = re.compile(r"^\s*\.text\.(\S+?):\s*$|Function : (\S+)")
# a definition that starts a region: a device function or a lambda bound to a name
_DEF = re.compile(r"(?:__(?:device|global)__[^(;]*?\b(\w+)\s*\(|\bauto\s+(\w+)\s*=\s*\[)")
_CALLABLE = re.compile(r"\b(\w+)\s*\(")


@dataclass
class Row:
    address: int
    sass: str
    samples: int
    not_issued: int | None = None
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def opcode(self) -> str:
        body = re.sub(r"^@!?U?P[T\d]+\s+", "", self.sass.strip())
        return body.split()[0].split(".")[0] if body else ""


def _number(text: str) -> int:
    text = (text or "").replace(",", "").strip()
    try:
        return int(float(text))
    except ValueError:
        return 0


def _columns(header: list[str]) -> tuple[int, int, int, int | None, dict[str, int]]:
    """(address, source, all samples, not-issued samples or None, {reason: column}) by name."""
    low = [h.strip().lower() for h in header]

    def find(*needles: str) -> int | None:
        return next((i for i, h in enumerate(low) if all(n in h for n in needles)), None)

    address, source = find("address"), find("source")
    total = next((i for i in (find("all samples"), find("sampl")) if i is not None), None)
    if address is None or source is None or total is None:
        raise ValueError("not an ncu source-page CSV (need address, source and sample columns); header: " + ", ".join(header))
    not_issued = next((i for i in (find("not-issued"), find("not issued")) if i is not None), None)
    reasons = {low[i].replace("stall_", "").strip(): i for i in range(len(low))
               if low[i].startswith("stall_") or low[i].startswith("smsp__pcsamp_warps_issue_stalled")}
    return address, source, total, not_issued, reasons


def read_source_csv(text: str) -> list[Row]:
    """The rows of `ncu --page source --csv --print-source sass` (the first table whose header has an
    address column; lines before it, such as ncu's own messages, are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "address" in line.lower() and "source" in line.lower()), None)
    if start is None:
        first = next((line for line in lines if line.strip()), "")
        raise ValueError("not an ncu source-page CSV (no header with address and source columns); header: "
                         + ", ".join(next(csv.reader([first]), [])))
    table = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    address, source, total, not_issued, reasons = _columns(table[0])
    rows = []
    for rec in table[1:]:
        if len(rec) <= max(address, source, total):
            continue
        addr = rec[address].strip()
        try:
            value = int(addr, 16) if addr.lower().startswith("0x") else int(addr)
        except ValueError:
            continue
        rows.append(Row(value, rec[source], _number(rec[total]),
                        _number(rec[not_issued]) if not_issued is not None else None,
                        {name: _number(rec[i]) for name, i in reasons.items()}))
    return rows


def line_table(sass: str, kernel: str = "") -> dict[int, list[tuple[str, int]]]:
    """Instruction offset -> location chain (innermost first) of the one function in an `nvdisasm -gi`
    listing whose name contains `kernel` (ValueError when several do: a library holds many
    instantiations, and samples joined with the wrong one's lines would mislead quietly)."""
    names = [m.group(1) or m.group(2) for m in map(_FUNC_HEADER.search, sass.splitlines()) if m]
    matching = [name for name in names if kernel in name]
    if len(matching) > 1:
        raise ValueError(f"{len(matching)} functions contain {kernel!r}; give more of the name: " + ", ".join(matching[:4]))
    table: dict[int, list[tuple[str, int]]] = {}
    # nvdisasm writes one `//##` line per inlining level before the instructions they cover, innermost
    # first ('File "a", line 400 inlined at "b", line 865', then 'File "b", line 865 inlined at ...');
    # the chain is the first location of each line of the group, and holds until the next group
    inside, chain, fresh = False, [], False
    for line in sass.splitlines():
        header = _FUNC_HEADER.search(line)
        if header:
            name = header.group(1) or header.group(2)
            if inside and table:
                break
            inside, chain = kernel in name, []
            continue
        if not inside:
            continue
        if "//##" in line:
            locs = _LOC.findall(line)
            if locs:
                chain = (chain if fresh else []) + [(locs[0][0], int(locs[0][1]))]
                fresh = True
            continue
        ins = _INS.search(line)
        if ins:
            fresh = False
            if chain:
                table[int(ins.group(1), 16)] = chain
    return table


class Regions:
    """Source location -> the name of the enclosing device function or named lambda."""

    def __init__(self):
        self._files: dict[str, list[str]] = {}

    def name(self, path: str, line: int) -> str:
        if path not in self._files:
            try:
                self._files[path] = Path(path).read_text().splitlines()
            except OSError:
                self._files[path] = []
        src = self._files[path]
        # walk up counting braces: a line that leaves the count negative opens a block around `line`;
        # the first such block whose header (that line or the few before it, for a header spread over
        # lines) defines a device function or a named lambda is the region (for / if blocks are skipped)
        depth = 0
        for i in range(min(line, len(src)) - 1, -1, -1):
            text = src[i].split("//")[0]
            depth += text.count("}") - text.count("{")
            if depth < 0:
                for j in range(i, max(i - 6, -1), -1):
                    head = src[j].split("//")[0].rstrip()
                    if j < i and head.endswith((";", "}", "{")):
                        break  # the previous statement: the header started below it
                    m = _DEF.search(head)
                    if m:
                        name = m.group(1) or m.group(2)
                        if name == "__launch_bounds__":  # the kernel's name follows on the next line
                            nxt = _CALLABLE.search(src[j + 1]) if j + 1 < len(src) else None
                            name = nxt.group(1) if nxt else name
                        return f"{Path(path).name}:{name}"
                depth = 0
        return f"{Path(path).name}:{line}"


def summarize(rows: list[Row], lines: dict[int, list[tuple[str, int]]] | None = None, top: int = 30) -> dict:
    total = sum(r.samples for r in rows) or 1
    by_op = collections.Counter()
    by_reason = collections.Counter()
    by_region = collections.Counter()
    by_loop_line = collections.Counter()
    by_step_line = collections.Counter()
    regions = Regions()
    for r in rows:
        by_op[r.opcode] += r.samples
        by_reason.update(r.reasons)
        if lines is not None:
            chain = lines.get(r.address)
            if chain:
                by_region[regions.name(*chain[0])] += r.samples
                # the statements two and three levels inside the kernel entry: the loop statement, then the
                # statement inside the step lambda it calls (softmax, PV issue, fold, ...)
                for depth, counter in ((2, by_loop_line), (3, by_step_line)):
                    site = chain[-depth] if len(chain) >= depth else chain[0]
                    counter[f"{Path(site[0]).name}:{site[1]} ({regions.name(*site).split(':')[1]})"] += r.samples
            else:
                by_region["(no line info)"] += r.samples
    share = lambda c: [(k, v, round(v / total, 4)) for k, v in c.most_common(top)]
    hottest = sorted(rows, key=lambda r: -r.samples)[:top]
    return {"samples": total, "instructions": len(rows), "by_opcode": share(by_op), "by_reason": share(by_reason),
            "by_region": share(by_region), "by_kernel_line": share(by_loop_line), "by_step_line": share(by_step_line),
            "hottest": [(hex(r.address), r.sass.strip(), r.samples, round(r.samples / total, 4), r.reasons) for r in hottest]}


def _print(summary: dict) -> None:
    print(f"{summary['samples']} samples over {summary['instructions']} instructions")
    for key, title in (("by_region", "by region (innermost function or lambda)"),
                       ("by_kernel_line", "by statement of the kernel body (the loops)"),
                       ("by_step_line", "by statement one call deeper (inside a loop's step)"),
                       ("by_opcode", "by opcode"), ("by_reason", "by stall reason")):
        if summary[key]:
            print(f"\n{title}:")
            for name, n, frac in summary[key]:
                print(f"  {100 * frac:5.1f}%  {n:>9}  {name}")
    print("\nhottest instructions:")
    for addr, sass, n, frac, reasons in summary["hottest"]:
        worst = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:3] if v)
        print(f"  {100 * frac:5.1f}%  {addr:>8}  {sass[:70]:<70}  {worst}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path, help="ncu --page source --csv --print-source sass output (.gz too)")
    parser.add_argument("--sass", type=Path, help="nvdisasm -c -gi listing of the same cubin (regions)")
    parser.add_argument("--kernel", default="", help="substring of the profiled kernel's name in --sass")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    raw = args.csv.read_bytes()
    rows = read_source_csv((gzip.decompress(raw) if args.csv.suffix == ".gz" else raw).decode(errors="replace"))
    lines = line_table(args.sass.read_text(errors="replace"), args.kernel) if args.sass else None
    if lines is not None and not lines:
        print(f"no function containing {args.kernel!r} with line info in {args.sass}", file=sys.stderr)
        return 2
    summary = summarize(rows, lines, args.top)
    if args.json:  # before printing: a reader that stops early (| head) must not cost the file
        args.json.write_text(json.dumps(summary, indent=1))
    _print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
