"""Opcode mix of a kernel's main loop, from SASS text (cuobjdump --dump-sass or nvdisasm -c output).

The per-tile instruction stream of the attention kernels decides their speed (docs/kernel-notes.md:
the ALU pipe, 16 lanes per scheduler, was the busiest pipe of the sm90 speed kernel). This counts the
instructions of one trip through the hottest loop: the backward branch with the largest body, walked
from its head along the fall-through path (conditional branches fall through, unconditional forward
branches are followed), so the tail-tile copy of the softmax that the loop jumps over is not counted.

  python3 bench/sass_loop_mix.py SASS_FILE [--kernel SUBSTRING ...]

Works here without a GPU: `nvcc -cubin ... -o k.cubin kernels/csrc/sm90_launch.cu` then `nvdisasm -c
k.cubin > k.sass` (nvdisasm ships in the pip wheel nvidia-cuda-nvdisasm), or on the GPU machine
with cuobjdump on the built .so.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

# pipe of each opcode family on sm_90 (per scheduler: FMA-pipe FFMA/FADD/FMUL issue every cycle over
# the heavy + lite halves, IMAD only on the heavy half; ALU 16 lanes; the rest as listed)
PIPES = {
    "FMA": {"FFMA", "FADD", "FMUL", "IMAD", "HFMA2", "HADD2", "HMUL2"},
    "ALU": {"LEA", "FMNMX", "IMNMX", "VIMNMX", "VIMNMX3", "FMNMX3", "LOP3", "SHF", "PRMT", "IADD3", "VIADD",
            "ISETP", "FSETP", "FSEL", "SEL", "I2FP", "F2IP", "PLOP3", "MOV", "SGXT", "FRND"},
    "XU": {"MUFU", "F2I", "I2F", "F2F"},
    "F2FP": {"F2FP"},
    "tensor": {"IGMMA", "QGMMA", "HGMMA", "WARPGROUP"},
    "memory": {"LDS", "STS", "LDL", "STL", "LDG", "STG", "LDSM", "SYNCS"},
}

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_FUNC = re.compile(r"(?:Function : |^\.text\.)(\S+?):?\s*$", re.M)


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """name -> [(address, instruction)] for every kernel in the dump."""
    out: dict[str, list[tuple[int, str]]] = {}
    marks = list(_FUNC.finditer(sass))
    for i, mark in enumerate(marks):
        body = sass[mark.end(): marks[i + 1].start() if i + 1 < len(marks) else len(sass)]
        labels = {m.group(1): int(m.group(2), 16) for m in re.finditer(r"^(\.L_x_\d+):\s*\n\s*/\*([0-9a-f]+)\*/", body, re.M)}
        rows = []
        for m in _LINE.finditer(body):
            ins = re.sub(r"`\((\.L_x_\d+)\)", lambda l: hex(labels.get(l.group(1), 0)), m.group(2).strip())
            rows.append((int(m.group(1), 16), ins))
        if rows:
            out[mark.group(1)] = rows
    return out


# the Hopper kernels with the V residual's second term / the mixed encoding (sm90_attention.cuh) carry VLO and CHORD as
# two more template arguments under their own name: vc_attention_sm90_kernel_lo_chord<..., KLANES, VLO, CHORD>
_LO_CHORD = re.compile(r"33vc_attention_sm90_kernel_lo_chordI(.*?)ELi\d+ELi\d+EEEv")


def plain_kernel_name(name: str) -> str:
    """A vc_attention_sm90_kernel_lo_chord name as the vc_attention_sm90_kernel of the same other template arguments
    (the product's kernel it varies); any other name as it is. Lets a variant build's kernels pair with the product's."""
    return _LO_CHORD.sub(r"24vc_attention_sm90_kernelI\1EEEv", name)


def opcode(ins: str) -> str:
    body = re.sub(r"^@!?U?P[T\d]+\s+", "", ins)
    return body.split()[0] if body else ""


def branch_target(ins: str) -> int | None:
    m = re.search(r"\bBRA(?:\.[A-Z.]+)?\s+(?:!?U?P\d+,\s*)?(0x[0-9a-f]+)", ins)
    return int(m.group(1), 16) if m else None


_VOTE_ALL = re.compile(r"\bVOTE\.ALL\s+(P\d+),")
_VOTE_ANY = re.compile(r"\bVOTE\.ANY\s+(P\d+),")


def hot_loop(rows: list[tuple[int, str]], any_back_branch: bool = False, votes_pass: bool = False,
             anys_fail: bool = False) -> list[str]:
    """Instructions of one fall-through trip through the largest loop (by address span).

    any_back_branch: unconditional backward branches close loops too (the portable kernel's chunk loop
    tests at its head and jumps back unconditionally; it has no barrier-retry blocks).
    votes_pass: at a forward branch on the predicate of the latest `VOTE.ALL` (a warp-uniform "every lane
    agrees" test, e.g. the clamp checks), take the path where the vote passed: follow `@P BRA`, fall
    through `@!P BRA`; every other conditional branch still falls through.
    anys_fail: at a forward branch on the predicate of the latest `VOTE.ANY` (a warp-uniform "some lane wants it" test,
    e.g. the rescale of O only where a row's max moved), take the path where no lane asked: follow `@!P BRA`, fall
    through `@P BRA` (the common chunk once the row maxima have settled)."""
    index = {addr: i for i, (addr, _) in enumerate(rows)}
    # conditional backward branches close loops; the unconditional ones come from the out-of-line
    # retry blocks of barrier waits at the end of the function, which jump back into the body
    loops = [(target, addr) for addr, ins in rows
             if (any_back_branch or ins.startswith("@")) and (target := branch_target(ins)) is not None and target < addr]
    if not loops:
        return []
    head, back = max(loops, key=lambda loop: loop[1] - loop[0])
    trip, i, vote, any_vote = [], index[head], None, None
    while i < len(rows) and rows[i][0] <= back:
        addr, ins = rows[i]
        trip.append(ins)
        target = branch_target(ins)
        unconditional = target is not None and not ins.startswith("@")
        if addr == back:
            break
        if votes_pass and (m := _VOTE_ALL.search(ins)):
            vote = m.group(1)
        if anys_fail and (m := _VOTE_ANY.search(ins)):
            any_vote = m.group(1)
        taken = votes_pass and vote is not None and target is not None and ins.startswith(f"@{vote} ")
        taken |= anys_fail and any_vote is not None and target is not None and ins.startswith(f"@!{any_vote} ")
        i = index[target] if (unconditional or taken) and target > addr and target in index else i + 1
    return trip


def mix(trip: list[str]) -> tuple[collections.Counter, collections.Counter]:
    ops = collections.Counter(opcode(ins).split(".")[0] for ins in trip)
    pipes = collections.Counter()
    for op, n in ops.items():
        pipes[next((p for p, members in PIPES.items() if op in members), "other")] += n
    return ops, pipes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass", type=Path)
    parser.add_argument("--kernel", action="append", default=[], help="only kernels whose name contains this (all given)")
    parser.add_argument("--top", type=int, default=14, help="opcodes listed per kernel")
    parser.add_argument("--any-back-branch", action="store_true",
                        help="unconditional backward branches close loops too (the portable mma kernels)")
    parser.add_argument("--votes-pass", action="store_true",
                        help="follow the path where each VOTE.ALL passed (e.g. the unclamped ExpCast encode)")
    parser.add_argument("--anys-fail", action="store_true",
                        help="follow the path where each VOTE.ANY found no lane (e.g. no rescale of O: no row max moved)")
    args = parser.parse_args()
    found = 0
    for name, rows in functions(args.sass.read_text()).items():
        if not all(k in name for k in args.kernel):
            continue
        trip = hot_loop(rows, args.any_back_branch, args.votes_pass, args.anys_fail)
        if not trip:
            continue
        found += 1
        ops, pipes = mix(trip)
        print(f"{name}\n  loop trip: {len(trip)} instructions; by pipe: " + ", ".join(f"{p} {n}" for p, n in pipes.most_common()))
        print("  " + ", ".join(f"{op} {n}" for op, n in ops.most_common(args.top)))
    if not found:
        print("no kernel with a loop matched", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
