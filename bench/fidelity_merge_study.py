"""Fidelity mode with V-Smooth segments (emulated, CPU): would merging its 128-row means where they agree keep its error?

Fidelity mode restores one V-Smooth mean per 128-key tile; speed mode merges 256-row blocks whose means agree
(reference.vsmooth_segments, the rms rule with kappa 1/3) and restores only at segment ends, which took 6-7% off the
portable kernel (docs/kernel-notes.md section 29). This prints, for the fidelity preset's grouping (128 clusters x 1
iteration) on the video-like data, the share of blocks that end a segment (what the portable kernel would still
restore) and fidelity mode's rel-L2 / V term / QK term (K scales per 256 keys, as config.FIDELITY) with: the spec's
128-row means ("channel"), 256-row means, and segments of 128- or 256-row blocks at kappa 1/3 and 1/4.

    python3 bench/fidelity_merge_study.py 32760 0 1
    python3 bench/fidelity_merge_study.py 75600 0
"""
import sys
import time

import torch

from vc_attention.bench import fidelity_study as fs
from vc_attention.kernels import reference as ref


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    size, seeds = int(argv[0]), [int(s) for s in argv[1:]] or [0]
    torch.set_num_threads(2)
    for seed in seeds:
        t0 = time.time()
        case = fs.make_case("video", size, 2, 128, seed, fs.Grouping(128, 1, "chain"))
        vp, n = case.v_perm, case.v_perm.shape[-2]
        for rows in (128, 256):
            for kappa in (1 / 3, 1 / 4):
                seg, seg_mu, bound = fs.merged_block_segments(vp, kappa, rows=rows, rms=True)
                mean = ref.expand_rows(seg_mu, rows, n)
                r_q, r_scale = ref.quantize_fp8_per_channel(vp.float() - mean, bound)
                key = f"merge{rows}k{round(1 / kappa)}"
                case.v_hat[key] = (r_q * r_scale + mean).float()
                ends = (seg[..., 1:] != seg[..., :-1]).float().mean().item()
                print(f"seed {seed} {key}: blocks ending a segment {ends:.3f}")
        for key in ("channel", "mean256", "merge128k3", "merge128k4", "merge256k3", "merge256k4"):
            r = fs.measure(case, fs.Knobs(p="exp2", k_block=256, v_scale=key))
            print(f"| {size} | {seed} | {key} | {r['rel_l2']:.5f} | {r['v_term']:.5f} | {r['qk_term']:.5f} |", flush=True)
        print("time", time.time() - t0)


if __name__ == "__main__":
    main()
