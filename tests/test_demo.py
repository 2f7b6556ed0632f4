"""CPU test of `vc-attention demo`: the tiny sample runs every preset mode and writes the PNG."""
import argparse

import pytest

from vc_attention import cli
from vc_attention.commands import demo, demo_modes
from vc_attention.nodes import presets


def run_demo(argv):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return demo.run(parser.parse_args(argv))


def test_demo_is_a_registered_subcommand():
    assert cli.SUBCOMMANDS["demo"] == "demo"


def test_tiny_cpu_demo_writes_png_and_tables_every_mode(tmp_path, capsys):
    out = tmp_path / "plots" / "demo.png"
    assert run_demo(["--device", "cpu", "--size", "tiny", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Plot written to {out}" in printed
    assert "EMULATION" in printed  # the CPU run says plainly what it is
    table_rows = {line.split()[0] for line in printed.splitlines() if "reference" in line.split()[1:2]}
    assert table_rows == set(presets.PRESETS) | {"plain-8bit"}


def test_cuda_request_without_gpu_is_one_sentence_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(demo_modes.torch.cuda, "is_available", lambda: False)
    assert cli.main(["demo", "--device", "cuda", "--size", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vc-attention demo: ") and "needs a CUDA GPU" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_demo_writes_only_where_asked(tmp_path, monkeypatch, capsys):
    """Without --out the plot goes to the temporary folder, never into the current folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    assert run_demo(["--device", "cpu", "--size", "tiny"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["tmp"]
    assert (tmp_path / "tmp" / "vc-attention" / "vc_attention_demo.png").is_file()


def test_size_choices_are_the_sample_table():
    assert demo.SIZES == tuple(demo_modes.SAMPLE_SIZES)


def test_gpu_table_and_plot_formatting(tmp_path, capsys):
    """The GPU branch's table and plot, fed with made-up timings (no GPU here): every row shows its
    speed-up over SDPA and the plot file is written."""
    sdpa = demo_modes.ModeResult("sdpa", "torch", 4e-3, 60.0, time_ms=10.0)
    rows = [demo_modes.ModeResult("balanced", "sm90", 8e-3, 63.0, time_ms=4.0, grouping_ms=1.5),
            demo_modes.ModeResult("speed", "sm90", 1e-2, 61.0, time_ms=2.5, grouping_ms=1.5)]
    demo_modes._print_table(rows, sdpa)
    printed = capsys.readouterr().out
    assert "speed-up" in printed and "2.50x" in printed and "4.00x" in printed and "1.00x" in printed
    out = tmp_path / "gpu.png"
    demo_modes._plot(rows, sdpa, True, out, "test")
    assert out.read_bytes()[:4] == b"\x89PNG"
