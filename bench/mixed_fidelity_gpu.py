"""Fidelity variants' error on the real kernel: rel-L2 of prebuilt Hopper variant libraries on video-like data.

A VC_SM90_EXP2_CHORD_EIGHTHS build (bench/sm90_variants.sh split_ch4 / split_ch6 / split_ch8) runs fidelity mode with
the chord for the last eighths of every step's keys (reference p="mixed"); a VC_SM90_V_LO build (split_lo16 /
split_lo32) adds the V-Smooth residual's second E4M3 term on 16 / 32 channels (VCConfig.v_lo_channels; its operands
from the reference prepare, which has them). `bench/sm90_variants.sh` times them and gates them against their specs;
this tool measures what each trade does to the error where issue 10 measures it: `vc-attention bench`'s video-like
data (Wan 480p / 720p grids, 2 heads, 1,024 sampled query rows against float64 exact attention), the fidelity preset's
grouping (nodes/presets.py: 128 clusters x 1 iteration, 8 within-cluster bins), the CUDA prepare, each library's
kernel through its C entry. Beside them SageAttention 2.2 (when importable) and the product's fidelity and speed modes
through the public op, in the same process; `--lanes` adds each library with K scales per lane.

    bash bench/sm90_variants.sh with SM90_VARIANTS="split split_ch2 split_ch4" SM90_BUILD_ONLY=1, then
    python3 bench/mixed_fidelity_gpu.py --lib build/sm90_variants/split.so --lib build/sm90_variants/split_ch4.so \
        --sizes 32760 75600 --seeds 0 1 --lanes --out $OUT
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from vc_attention.bench.sm90_check import Sm90Library
from vc_attention.commands.bench_attention import FIDELITY_HEADS, FIDELITY_ROWS
from vc_attention.commands.bench_peers import sageattention_module
from vc_attention.kernels import grouping, prepare_cuda
from vc_attention.kernels.api import vc_attention
from vc_attention.kernels.config import FIDELITY, SPEED
from vc_attention.kernels.prepare_reference import prepare_reference
from vc_attention.nodes import presets
from vc_attention.study.videodata import video_like_qkv

GRIDS = {32760: (21, 30, 52), 75600: (21, 45, 80)}  # Wan 480p / 720p latents after 1x2x2 patches


def fidelity_perm(v: torch.Tensor) -> torch.Tensor:
    """The fidelity preset's grouping of v (its clusters, iterations and within-cluster bins)."""
    p = presets.PRESETS["fidelity"]
    return grouping.group_tokens(v, int(p["clusters"]), int(p["kmeans_iters"]),
                                 within_bins=presets.within_bins("fidelity")).perm()


def rel_l2_table(libs: list[Sm90Library], sizes: list[int], seeds: list[int], lanes: bool) -> dict:
    """{size: {row label: mean rel-L2 over seeds}}."""
    sage = sageattention_module()
    table: dict = {}
    for n in sizes:
        grid, rows_out = GRIDS[n], {}
        for seed in seeds:
            q, k, v = video_like_qkv(B=1, H=FIDELITY_HEADS, T=grid[0], Hgrid=grid[1], Wgrid=grid[2], D=128, seed=seed,
                                     dtype=torch.bfloat16, device="cuda")
            rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:FIDELITY_ROWS].to("cuda")
            exact = torch.softmax(q[:, :, rows].double() @ k.double().transpose(-1, -2) / 128 ** 0.5, dim=-1) @ v.double()

            def add(label, out):
                err = float((out[:, :, rows].double() - exact).norm() / exact.norm())
                rows_out[label] = rows_out.get(label, 0.0) + err / len(seeds)

            perm = fidelity_perm(v)
            if sage is not None:
                add("sageattention-2.2", sage.sageattn(q, k, v, tensor_layout="HND"))
            add("product fidelity (public op)", vc_attention(q, k, v, config=FIDELITY, perm=perm, perm_from_grouping=True))
            add("product speed (public op, fidelity's grouping)", vc_attention(q, k, v, config=SPEED, perm=perm,
                                                                               perm_from_grouping=True))
            for config in (FIDELITY, FIDELITY.with_(k_lane_scales=True)) if lanes else (FIDELITY,):
                operand_sets: dict = {}
                for lib in libs:
                    spec, operands = lib.spec(config), lib.operand_config(config)
                    if operands.tag not in operand_sets:  # the CUDA prepare has no second V term: the reference's
                        operand_sets[operands.tag] = (prepare_cuda.prepare_cuda(q, k, v, perm, config) if operands == config
                                                      else prepare_reference(q, k, v, perm, operands))
                    out = torch.full_like(q, float("nan"))
                    lib.run(operand_sets[operands.tag], out, "bhnd", spec)
                    add(f"{lib.name}: {spec.tag}" + (f" (chord {lib.chord_eighths}/8)" if lib.chord_eighths else ""), out)
                del operand_sets
            torch.cuda.synchronize()
        table[n] = rows_out
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", action="append", required=True, help="prebuilt Hopper variant library (repeatable)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32760], choices=sorted(GRIDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--lanes", action="store_true", help="also each library with K scales per lane")
    parser.add_argument("--out", default=None, help="folder for mixed-fidelity.json")
    args = parser.parse_args(argv)
    libs = [Sm90Library(Path(p).resolve()) for p in args.lib]
    table = rel_l2_table(libs, args.sizes, args.seeds, args.lanes)
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                  date=datetime.date.today().isoformat(), seeds=args.seeds, rows=FIDELITY_ROWS, heads=FIDELITY_HEADS,
                  command="python3 bench/mixed_fidelity_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  rel_l2={str(n): t for n, t in table.items()})
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "mixed-fidelity.json").write_text(json.dumps(result, indent=1))
    print(f"\nGPU {result['gpu']}, torch {result['torch']}, CUDA {result['cuda']}; rel-L2 vs float64, seeds {args.seeds}")
    for n, rows in table.items():
        sage = rows.get("sageattention-2.2")
        print(f"N = {n}")
        for label, err in rows.items():
            print(f"  {label:<64} {err:.5f}" + (f"  {err / sage:.3f}x SA2.2" if sage else ""))


if __name__ == "__main__":
    main()
