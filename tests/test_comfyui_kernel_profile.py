"""The ComfyUI run profiler's arithmetic (commands/comfyui_kernel_profile.py): busy time is the union
of kernel intervals, and kernels are sorted into kinds by name."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "commands"))
import comfyui_kernel_profile as kp  # noqa: E402  (the worker imports it the same way, as a sibling)


def test_busy_time_is_the_union_of_the_kernel_intervals():
    assert kp.busy_us([]) == 0
    assert kp.busy_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17  # overlap and containment counted once
    assert kp.busy_us([(20, 25), (0, 10)]) == 15  # order does not matter


def test_kernels_are_sorted_into_kinds_by_name():
    assert kp.kind_of("void vc::prepare_quantize_staged_kernel<__nv_bfloat16, 128, false>") == "ours: prepare"
    assert kp.kind_of("vc::group_order_kernel(vc::GroupParams, bool)") == "ours: grouping"
    assert kp.kind_of("qk_int8_sv_f8_accum_f32_attn_inst_buf") == "sage: attention"
    assert kp.kind_of("flash_fwd_kernel") == "sdpa: flash"
    assert kp.kind_of("void vc_sm90::consumers2::vc_attention_sm90_kernel<128, true, true>") == "ours: attention"
    assert kp.kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7") == "sdpa: cudnn"
    assert kp.kind_of("nvjet_tst_128x256") == "gemm"
    assert kp.kind_of("elementwise_kernel") == "other"
