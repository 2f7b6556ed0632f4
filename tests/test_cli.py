"""The command line as a new user meets it: fast --help, one-sentence errors, a doctor that says the fix."""
import json
import re
import subprocess
import sys
import time

import pytest

from vc_attention import cli
from vc_attention.commands import fidelity


def test_help_does_not_import_torch():
    """`vc-attention --help` builds every subcommand's parser: no module may load torch for that."""
    script = ("import sys, time; t = time.perf_counter(); from vc_attention import cli; cli.build_parser(); "
              "print('torch' in sys.modules, time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    loaded, seconds = out.stdout.split()
    assert loaded == "False", "a command module imports torch at its top level"
    assert float(seconds) < 1.0


def test_help_answers_in_under_a_second():
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vc_attention.cli", "--help"], capture_output=True, timeout=120, check=True)
    assert time.perf_counter() - start < 1.5  # interpreter start included (torch alone takes 5+ s here)


NO_GPU_COMMANDS = [
    ["build"],
    ["bench", "--shapes", "1,1,256,64", "--reps", "1"],
    ["bench", "--e2e"],
    ["demo", "--device", "cuda", "--size", "tiny"],
    ["fidelity", "--device", "cuda"],
]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the machine without a GPU")
@pytest.mark.parametrize("argv", NO_GPU_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_gpu_commands_without_a_gpu_say_one_sentence_with_the_remedy_and_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"vc-attention {argv[0]}: ") and "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert "install" in err or "nvidia-smi" in err  # the remedy, not only the problem


def test_a_programming_error_still_shows_its_traceback(monkeypatch):
    from vc_attention.commands import doctor

    def broken(args):
        raise KeyError("bug")

    monkeypatch.setattr(doctor, "run", broken)
    with pytest.raises(KeyError):
        cli.main(["doctor"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the machine without a GPU")
def test_doctor_names_the_fix(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["fix"] and "install a CUDA build of PyTorch" in facts["fix"][0]
    assert cli.main(["doctor"]) == 0
    assert "\nfix\n  - " in capsys.readouterr().out


def test_fidelity_json_keys_all_have_a_legend_in_help_and_readme(capsys):
    from pathlib import Path

    assert cli.main(["fidelity", "--json", "--heads", "1", "--frames", "1", "--height", "8", "--width", "16"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    keys = set(result) | set(result["rows"][0]) | set(result["grouping"])
    legend = fidelity.JSON_LEGEND
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for key in keys:
        assert re.search(rf"\b{key}\b", legend), key
        assert f"`{key}`" in readme, key
    # progress lines carry the elapsed time, from the first (slow) stage on
    stages = [line for line in captured.err.splitlines() if line.startswith("  [")]
    assert stages[0].endswith("exact fp64 attention ...") and all(" s] " in line for line in stages)
    parser = cli.build_parser()
    help_text = parser._subparsers._group_actions[0].choices["fidelity"].format_help()
    assert "--json keys" in help_text and "v_share" in help_text


def test_build_reports_every_failed_extension_and_exits_1(monkeypatch, capsys):
    """`vc-attention build` builds the extensions side by side; a failure does not hide the others."""
    from vc_attention.commands import build
    from vc_attention.kernels import backend_mma, grouping_fused, jit, prepare_cuda

    def broken(what):
        def fail():
            raise jit.JitError(f"nvcc failed for {what}")
        return fail

    monkeypatch.setenv(jit.ENV_PREFIX + "ARCH", "8.9")  # no GPU needed to name the target
    monkeypatch.setattr(prepare_cuda, "extension", lambda: None)
    monkeypatch.setattr(backend_mma, "extension", broken("mma"))
    monkeypatch.setattr(grouping_fused, "extension", broken("grouping"))
    args = cli.build_parser().parse_args(["build"])
    assert build.run(args) == 1
    out = capsys.readouterr().out
    assert "prepare kernels ready for sm_89" in out
    assert "nvcc failed for mma" in out and "nvcc failed for grouping" in out
    assert "2 of 3 extensions failed (grouping, mma)" in out
