"""GPU tier: the bindings' refusals reach Python as ValueError, with the values they name, instead of ending the process.

On the H200 (torch 2.11, session 20) refusals of the sm90 `attention` binding and of the prepare extension's
`prepare_attend` that were formatted with an integer argument killed the process (SIGSEGV). Session 21 found why
(bench/refusal_probe.py): any number written through an std::ostream inside our JIT-built extensions crashes there,
and TORCH_CHECK formats a message of several parts through one. Every message is now one literal or one vc::text(...)
(kernels/csrc/refusal_text.h, std::to_string; tests/test_refusal_text.py checks the sources), so the refusals name
their values again. Inside ComfyUI a crash takes the whole server down, so each refusal runs here in a process of its
own (a crash is then a failed case with its exit status, not a lost test run).

  pytest -q -m gpu tests/test_binding_refusals_gpu.py
"""
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# one child per case: it builds valid FIDELITY operands for a (1, 2, 500, 128) call, breaks one thing, calls the
# binding and prints the exception's type and text (or "ran")
CHILD = r'''
import sys, torch
from vc_attention.kernels import backend_sm90, prepare_cuda as prep
from vc_attention.kernels.config import FIDELITY
case = sys.argv[1]
gen = torch.Generator(device="cuda").manual_seed(1)
q, k, v = (torch.randn(1, 2, 500, 128, generator=gen, device="cuda").bfloat16() for _ in range(3))
out = torch.empty_like(q)
try:
    if case.startswith("grouping_"):  # the fused k-means binding's integer-formatted refusals
        from vc_attention.kernels import grouping_fused
        d = 96 if case == "grouping_head_dim_96" else 128
        c = 300 if case == "grouping_clusters_300" else 4  # more than kGroupMaxClusters (256)
        vg = torch.randn(1, 2, 500, d, device="cuda").bfloat16()
        z = torch.zeros(1, device="cuda")
        grouping_fused.extension().kmeans_group(vg, torch.zeros(2, c, d, device="cuda"), z, z, z, None, None, None, None,
                                                None, 1, False, False, 1 << 20, 0)
    elif case == "prepare_head_dim_96":  # the prepare binding's: formatted with an integer too
        q96 = torch.randn(1, 2, 500, 96, device="cuda").bfloat16()
        prep.extension().prepare(q96, q96, q96, None, None, 0.1, False, True, True, 128, False, 256, False, 0)
    elif case.startswith("prepare_attend"):
        from vc_attention.kernels.config import SPEED
        speed = case == "prepare_attend_speed_mode_2_on_per_tile_scales"
        if speed:
            config = SPEED.with_(k_lane_scales=False, k_scale_rows=128)
        else:
            config = FIDELITY.with_(k_scale_rows=128) if case == "prepare_attend_paired_bit_on_per_tile_scales" else FIDELITY
        mode = 3 if case == "prepare_attend_mode_3" else (2 if speed else 5)
        forward, error = backend_sm90._entry()
        prep.extension().prepare_attend(*prep.binding_args(q, k, v, None, config, "bhnd", None, None), out, speed,
                                        mode, forward, error, False)
    else:
        ops = prep.prepare_cuda(q, k, v, None, FIDELITY, "bhnd")
        mode = {"attention_vsmooth_3": 3, "attention_vsmooth_negative": -1, "attention_paired_bit_alone": 4}.get(case, 1)
        seg = torch.ones(1, 2, 4, dtype=torch.uint8, device="cuda") if case == "attention_segments_without_mode_2" else None
        q_q = ops.q_q.float() if case == "attention_q_dtype" else ops.q_q
        low = None
        if case == "attention_low_rank_rank_7":
            low = (torch.zeros(1, 2, 8, 512, device="cuda").to(torch.float8_e4m3fn),
                   torch.zeros(1, 2, 7, 128, device="cuda", dtype=torch.half), torch.ones(1, 2, 7, device="cuda"))
        backend_sm90.extension().attention(q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean,
                                           *(low or (None, None, None)), out, ops.n_tokens, False, mode,
                                           torch.cuda.current_stream().cuda_stream, seg)
    torch.cuda.synchronize()
    print("ran")
except (ValueError, RuntimeError, TypeError) as err:
    print(type(err).__name__, str(err).splitlines()[0])
'''

CASES = {
    "attention_vsmooth_3": "vsmooth must be 0 (per-channel V), 1 (V-Smooth) or 2",
    "attention_vsmooth_negative": "got -1.",
    "attention_paired_bit_alone": "got 4.",
    "attention_segments_without_mode_2": "v_seg_end needs vsmooth=2",
    "attention_q_dtype": "q_q has dtype Float, expected Char.",
    "attention_low_rank_rank_7": "rank 1..6, got rank 7.",
    "prepare_attend_mode_3": "got 3 with V-Smooth.",
    "prepare_attend_paired_bit_on_per_tile_scales": "K scales are paired",
    "prepare_attend_speed_mode_2_on_per_tile_scales": "vsmooth_mode 2 with ExpCast",
    # integer-formatted refusals of the other two bindings (through vc::text since session 21)
    "grouping_head_dim_96": "head dim must be 64 or 128, got 96.",
    "grouping_clusters_300": "clusters must be between 1 and min(N, 256), got 300.",
    "prepare_head_dim_96": "head dim must be 64 or 128, got 96.",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_refusal_raises_value_error_in_a_live_process(case):
    if backends_sm90_unavailable():
        pytest.skip("the sm90 backend is not available here")
    child = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, f"{case}: the process ended with {child.returncode}\n{child.stderr[-2000:]}"
    assert child.stdout.strip().startswith("ValueError") and CASES[case] in child.stdout, child.stdout


def test_the_child_runs_a_valid_call():
    """The harness itself: the unbroken call runs (so a case's ValueError is its own refusal)."""
    if backends_sm90_unavailable():
        pytest.skip("the sm90 backend is not available here")
    child = subprocess.run([sys.executable, "-c", CHILD, "prepare_attend_valid"], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and child.stdout.strip() == "ran", (child.stdout, child.stderr[-2000:])


def backends_sm90_unavailable() -> bool:
    from vc_attention.kernels import backends

    return bool(backends.get("sm90").availability())
