"""Do pairs of prebuilt Hopper variant libraries give the same output bits? (same operands, same configuration)

A variant that changes only how the kernel issues its work (VC_SM90_LO_MERGED: the V residual's second term inside the
PV MMA, the default, against its own wgmma beside it) must give the same output as the build it replaces; a tolerance
gate against the emulation (bench/sm90_check.py) would also pass a small arithmetic change. This runs both libraries on the same
reference-prepared operands (fidelity's preset as the first library implements it, bf16, video-like and random data)
and reports, per case, how many output elements differ and the largest difference.

  python bench/lib_identity.py --lib build/sm90_variants/sm90_split_ch8_lo32x2.so \
      --lib build/sm90_variants/sm90_split_ch8_lo32.so [--lib A2 --lib B2 ...] [--out DIR]

Consecutive --lib arguments pair up; one identity.json under --out holds every pair. Exit status 1 when any pair
differs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sm90_check import FIDELITY, Sm90Library, make_inputs  # noqa: E402

from vc_attention.kernels.prepare_reference import prepare_reference  # noqa: E402

CASES = ((1, 4, 4097, 128, True), (1, 8, 32760, 128, True), (2, 3, 1000, 128, False))


def compare(lib_a: Sm90Library, lib_b: Sm90Library) -> list[dict]:
    spec_a, spec_b = lib_a.spec(FIDELITY, 128), lib_b.spec(FIDELITY, 128)
    if spec_a != spec_b:
        raise SystemExit(f"the libraries implement different configurations: {spec_a.tag} vs {spec_b.tag}")
    rows = []
    for seed, (b, h, n, d, video) in enumerate(CASES):
        q, k, v = make_inputs(b, h, n, d, torch.bfloat16, "bhnd", seed=seed, video_like=video)
        perm = torch.stack([torch.randperm(n, device="cuda") for _ in range(b * h)]).view(b, h, n)
        ops = prepare_reference(q, k, v, perm, spec_a, "bhnd")
        outs = []
        for lib in (lib_a, lib_b):
            out = torch.full_like(q, float("nan"))
            lib.run(ops, out, "bhnd", spec_a)
            outs.append(out)
        torch.cuda.synchronize()
        diff = (outs[0].float() - outs[1].float()).abs()
        rows.append(dict(shape=[b, h, n, d], video_like=video, config=spec_a.tag,
                         differing=int((outs[0] != outs[1]).sum().item()), elements=outs[0].numel(),
                         max_abs_diff=float(diff.max().item()), finite=bool(torch.isfinite(outs[1]).all())))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", action="append", required=True, help="prebuilt variant libraries, in pairs")
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    if len(args.lib) % 2:
        parser.error("give the libraries in pairs (an even number of --lib)")
    pairs, same = [], True
    for path_a, path_b in zip(args.lib[::2], args.lib[1::2]):
        lib_a, lib_b = Sm90Library(Path(path_a)), Sm90Library(Path(path_b))
        rows = compare(lib_a, lib_b)
        pairs.append(dict(libs=[lib_a.name, lib_b.name], cases=rows))
        for r in rows:
            same = same and r["differing"] == 0 and r["finite"]
            print(f"[identity {lib_a.name} vs {lib_b.name}] {r['shape']} video={r['video_like']}: "
                  f"{r['differing']}/{r['elements']} differ, max |diff| {r['max_abs_diff']:.3g}, finite {r['finite']}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                  command="python3 bench/lib_identity.py " + " ".join(f"--lib {p}" for p in args.lib), pairs=pairs)
    (Path(args.out) / "identity.json").write_text(json.dumps(result, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
