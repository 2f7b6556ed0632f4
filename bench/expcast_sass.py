"""SASS check of the speed path: no MUFU.EX2 and no per-element F2I in any ExpCast kernel (GPU machine).

Builds the attention extensions through kernels/jit.py (the JIT cache: the same binaries the
backends run), dumps their SASS with cuobjdump and counts, per kernel instantiation, MUFU.EX2, F2I
and F2FP (the E4M3 pair cast). Speed kernels must have zero MUFU.EX2. F2I: the integer ExpCast form
(csrc/p_encoding.cuh) converts one row constant per row and online-softmax step (T0 = F2I((TOP + e)
2^23)), never an element, so a speed kernel may hold at most one F2I per four F2FP pair casts (one per
eight encoded elements; a per-element conversion would be two per cast), plus the unsigned one of an
integer division (`bh / heads` in the epilogue: the reciprocal from MUFU.RCP, lowered by 2 ulps with
an add of 0xffffffe, then F2I.FTZ.U32.TRUNC of that register). The exp2 kernels must have MUFU.EX2
(proof that the count sees the instruction at all).

  python3 bench/expcast_sass.py [--out DIR]

Exit status 0 when every check holds, 1 otherwise; the table is printed, the SASS saved under --out.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from vc_attention.kernels import backend_mma, backend_sm90

OPS = ("MUFU.EX2", "F2I", "F2I.U32", "F2FP")
# kernel name -> (short name, its bool template parameters in order)
KERNELS = {
    "attn_mma_kernel": ("mma", ("qk_fp8", "expcast", "vsmooth")),
    "attn_mma_wide_kernel": ("mma", ("qk_fp8", "expcast", "vsmooth")),  # the backend's default layout
    "vc_attention_sm90_kernel": ("sm90", ("expcast", "vsmooth")),
}


def find_cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    if nvcc and (Path(nvcc).parent / "cuobjdump").is_file():
        return str(Path(nvcc).parent / "cuobjdump")
    raise SystemExit("cuobjdump not found (it ships with the CUDA toolkit next to nvcc).")


def count_ops(block: str) -> dict:
    """Occurrences of each opcode (with modifiers in any order after it: F2I.FTZ.U32.TRUNC counts as
    F2I and F2I.U32); I2FP / F2IP (other instructions) do not match F2I / I2F."""
    counts = {}
    for op in OPS:
        opcode, *mods = op.split(".")
        found = re.findall(r"\b" + opcode + r"((?:\.[A-Z0-9_]+)*)(?=\s)", block)
        counts[op] = sum(all("." + m in "".join(f) + "." for m in mods) for f in found)
    return counts


def division_f2i(block: str) -> int:
    """F2I.U32.TRUNC instructions that are the last step of an unsigned integer division: their source
    register was last written by the add of 0xffffffe (2 ulps below the MUFU.RCP reciprocal, so the
    truncated quotient estimate is never too large). ptxas emits this for `bh / heads`."""
    lines = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", block)
    count = 0
    for i, ins in enumerate(lines):
        m = re.match(r"(?:@!?P\w+\s+)?F2I(?:\.[A-Z0-9_]+)*\s+R\d+,\s*(R\d+)", ins)
        if not m or ".U32" not in ins.split()[0 if not ins.startswith("@") else 1]:
            continue
        src = m.group(1)
        for prev in reversed(lines[:i]):  # the latest instruction that writes src
            ops = prev.split(None, 2)
            body = ops[1:] if prev.startswith("@") else ops
            if len(body) >= 2 and body[1].split(",")[0].strip() == src:
                count += "0xffffffe" in prev
                break
    return count


def kernel_rows(sass: str) -> list[dict]:
    rows = []
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        kind = next((k for k in KERNELS if k in name), None)
        if kind is None:
            continue
        short, params = KERNELS[kind]
        flags = dict(zip(params, re.findall(r"Lb([01])E", name)))
        head_dim = re.search(r"ILi(\d+)E", name).group(1)
        tag = f"{short} d{head_dim} " + " ".join(f"{k}={v}" for k, v in flags.items()) + (" bf16" if "bfloat16" in name else "")
        rows.append({"kernel": tag, "expcast": flags["expcast"] == "1", **count_ops(block),
                     "division F2I": division_f2i(block)})
    return rows


def failures(rows: list[dict]) -> list[str]:
    bad = []
    for row in rows:
        row_f2i = row["F2I"] - row["division F2I"]  # the row constants of the integer form
        if row["expcast"] and (row["MUFU.EX2"] or 4 * row_f2i > row["F2FP"]):
            bad.append(f"{row['kernel']}: speed kernel has MUFU.EX2={row['MUFU.EX2']}, F2I={row['F2I']} "
                       f"(of them unsigned {row['F2I.U32']}, integer divisions {row['division F2I']})")
        if not row["expcast"] and not row["MUFU.EX2"]:
            bad.append(f"{row['kernel']}: exp2 kernel shows no MUFU.EX2 (the count is broken)")
    if not any(row["expcast"] for row in rows):
        bad.append("no ExpCast kernel found in the SASS")
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out", help="folder for the SASS dumps")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cuobjdump = find_cuobjdump()
    modules = {"mma": backend_mma.extension()}
    if torch.cuda.get_device_capability() == (9, 0):
        modules["sm90"] = backend_sm90.extension()
    rows = []
    for name, module in modules.items():
        sass = subprocess.run([cuobjdump, "--dump-sass", module.__file__], capture_output=True, text=True, check=True).stdout
        (out_dir / f"{name}.sass").write_text(sass)
        rows += kernel_rows(sass)
    cols = (*OPS, "division F2I")
    print(f"{'kernel':<48} " + " ".join(f"{op:>12}" for op in cols))
    for row in rows:
        print(f"{row['kernel']:<48} " + " ".join(f"{row[op]:>12}" for op in cols))
    bad = failures(rows)
    print("\n".join(bad) if bad else f"OK: {sum(r['expcast'] for r in rows)} speed kernels without MUFU.EX2 or a per-element F2I")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
