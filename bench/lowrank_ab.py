"""Where the low-rank V term's kernel time goes: interleaved A/B timing of one prebuilt Hopper library.

Per mode, in rounds (so clock drift hits every arm alike): (a) the plain kernel on rank-0 operands,
(b) the plain kernel on rank-k operands with the term dropped (same code, the data of the term's
residual), (c) the LOWRANK kernel on the rank-k operands. (b) - (a) is the data, (c) - (b) the code.

  python3 bench/lowrank_ab.py --lib build/sm90_variants/sm90_split.so --out ab.json [--rank 6] [--rounds 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from sm90_check import Sm90Library, make_inputs  # bench/ is the script's own folder
from vc_attention.commands.bench import cuda_time_ms
from vc_attention.kernels import FIDELITY, SPEED
from vc_attention.kernels.prepare_reference import prepare_reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--shape", default="1,40,75600,128")
    args = parser.parse_args()
    lib = Sm90Library(Path(args.lib).resolve())
    b, h, n, d = (int(x) for x in args.shape.split(","))
    q, k, v = make_inputs(b, h, n, d, torch.bfloat16, "bhnd", seed=1234)
    perm = torch.argsort(torch.rand(b, h, n, device="cuda"), dim=-1)
    out = torch.empty_like(q)
    rows = []
    for mode, config in (("speed", SPEED), ("fidelity", FIDELITY)):
        plain_ops = prepare_reference(q, k, v, perm, config)
        low_ops = prepare_reference(q, k, v, perm, config.with_rank(args.rank))
        dropped = dataclasses.replace(low_ops, v_low_t=None, v_low_scale=None, v_low_basis=None)
        arms = {"a plain kernel, rank-0 data": plain_ops, "b plain kernel, rank-k data": dropped,
                "c low-rank kernel, rank-k data": low_ops}
        for rnd in range(args.rounds):
            for arm, ops in arms.items():
                ms = cuda_time_ms(lambda: lib.run(ops, out, "bhnd", config), args.iters, warmup=2)
                rows.append(dict(mode=mode, round=rnd, arm=arm, ms=ms))
                print(f"[{mode} round {rnd}] {arm}: {ms:.2f} ms", flush=True)
        del plain_ops, low_ops, dropped
        torch.cuda.empty_cache()
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda, lib=lib.name,
               shape=[b, h, n, d], rank=args.rank)
    Path(args.out).write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    for mode in ("speed", "fidelity"):
        for arm in sorted({r["arm"] for r in rows}):
            ms = sorted(r["ms"] for r in rows if r["mode"] == mode and r["arm"] == arm)
            print(f"{mode:9s} {arm:32s} median {ms[len(ms) // 2]:.2f} ms (rounds {', '.join(f'{x:.2f}' for x in ms)})")


if __name__ == "__main__":
    main()
