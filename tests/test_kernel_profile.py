"""bench/kernel_profile.py without a GPU: its target names and the parsing of ncu's CSV.

The profile itself runs on the GPU machine (docs/kernel-notes.md section 16); what can go wrong
off it is a target list that names a variant that does not exist, or ncu rows read into the wrong
column or the wrong launch, which would put one kernel's figures under another's name.
"""
import pytest

from vc_attention.bench import kernel_profile


@pytest.fixture(scope="module")
def kp():
    return kernel_profile


def test_targets(kp):
    assert kp.parse_target("sa-portable") == ("sa-portable", "", "")
    assert kp.parse_target("mma:wide-coalesced:speed") == ("mma", "wide-coalesced", "speed")
    assert kp.parse_target("sm90:fidelity") == ("sm90", "", "fidelity")
    for bad in ("mma:nosuch:speed", "mma:wide:fast", "sm90", "sa-sm90:speed", "cudnn"):
        with pytest.raises(ValueError):
            kp.parse_target(bad)


def test_sm90_targets_take_the_fidelity_preset_less_one_refinement(kp):
    from vc_attention.kernels.config import FIDELITY, SPEED

    assert kp.parse_target("sm90:fidelity-noterm") == ("sm90", "", "fidelity-noterm")
    with pytest.raises(ValueError, match="sm90 also"):
        kp.parse_target("mma:wide:fidelity-noterm")  # the portable kernel has neither refinement
    noterm, nochord = kp.sm90_config("fidelity-noterm"), kp.sm90_config("fidelity-nochord")
    assert noterm == FIDELITY.with_(v_lo_channels=0) and noterm.p == "mixed"
    assert nochord == FIDELITY.with_(p="exp2") and nochord.v_lo_channels == FIDELITY.v_lo_channels > 0
    assert kp.sm90_config("fidelity") == FIDELITY and kp.sm90_config("speed") == SPEED


def test_a_bad_target_is_a_usage_error(kp, capsys):
    with pytest.raises(SystemExit):
        kp.main(["--targets", "mma:nosuch:speed"])
    assert "unknown" in capsys.readouterr().err


HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name","Metric Name","Metric Unit","Metric Value"\n'


def _row(launch, kernel, metric, unit, value):
    return f'"{launch}","1","python3","h","{kernel}","1","7","S","{metric}","{unit}","{value}"\n'


def test_ncu_csv_is_grouped_per_launch_in_launch_order(kp):
    text = ("==PROF== Connected to process 1\nsomething the process printed\n" + HEADER
            + _row(1, "attn_mma_wide_kernel", "Duration", "ms", "24.1") + _row(0, "qk_int_sv_f8_attn_kernel", "Duration", "ms", "18.3")
            + _row(0, "qk_int_sv_f8_attn_kernel", "Issue Slots Busy", "%", "61.2") + "==PROF== Disconnected\n"
            + _row(1, "attn_mma_wide_kernel", "Registers Per Thread", "register/thread", "255"))
    launches = kp.parse_ncu_csv(text)
    assert [m["Kernel Name"] for m in launches] == ["qk_int_sv_f8_attn_kernel", "attn_mma_wide_kernel"]
    assert launches[0] == {"Kernel Name": "qk_int_sv_f8_attn_kernel", "Duration": "18.3 ms", "Issue Slots Busy": "61.2 %"}
    assert launches[1]["Registers Per Thread"] == "255 register/thread" and launches[1]["Duration"] == "24.1 ms"
    assert kp.parse_ncu_csv("==PROF== no kernels were profiled\n") == []


def test_stall_reasons_are_read_by_short_name_largest_first(kp):
    launch = {"Kernel Name": "k", "Duration": "4.6 ms",
              "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "0.92",
              "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "1,250.5",
              "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "1.03 ratio"}
    assert list(kp.stall_reasons(launch).items()) == [("long_scoreboard", 1250.5), ("wait", 1.03), ("barrier", 0.92)]
    assert kp.stall_reasons({"Kernel Name": "k"}) == {}


def test_pipe_use_is_read_by_short_name_busiest_first(kp):
    launch = {"Kernel Name": "k", "Duration": "4.6 ms",
              "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": "61.5 %",
              "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": "33.1",
              "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active": "72.25 %",
              "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "1.03"}
    assert list(kp.pipe_use(launch).items()) == [("alu", 72.25), ("xu", 61.5), ("fma", 33.1)]
    assert kp.pipe_use({"Kernel Name": "k"}) == {}
