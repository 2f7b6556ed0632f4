"""The README's snippets run, so the docs cannot drift from the code.

- every ```python block is executed (in one namespace per block), except those whose first line
  names the test that runs them with the objects they need (`# run by tests/...`);
- every line of a ```bash block that starts with `vc-attention` is run through the CLI's main()
  unless the line carries a `# gpu` comment (those need a CUDA GPU);
- the test command in the README is the exact command .ci/run executes.
"""
import re
import shlex
from pathlib import Path

import pytest

from vc_attention import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _cli_lines():
    lines = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = line.strip()
            if line.startswith("vc-attention") and "# gpu" not in line:
                lines.append(line.split("#")[0].strip())
    return lines


def test_readme_test_command_is_what_ci_runs():
    tests_section = README.split("## Tests", 1)[1]
    command = _blocks("bash")[[b in tests_section for b in _blocks("bash")].index(True)].strip().splitlines()[0]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci


@pytest.mark.parametrize("code", [b for b in _blocks("python") if not b.startswith("# run by tests/")],
                         ids=lambda c: c.splitlines()[0][:40])
def test_python_snippet_runs(code):
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_snippet"})


@pytest.mark.parametrize("line", _cli_lines())
def test_cli_snippet_runs(line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(line)[1:]
    assert cli.main(argv) == 0


def _between(marker):
    return README.split(f"<!-- {marker}:begin -->", 1)[1].split(f"<!-- {marker}:end -->", 1)[0].strip()


def test_widget_table_is_generated_from_the_preset_table():
    from vc_attention.nodes import presets

    assert _between("widgets") == presets.widgets_markdown().strip()


def test_fidelity_table_is_the_one_the_cli_doc_records():
    table = [line for line in _between("fidelity").splitlines() if line.startswith("|")]
    doc = (ROOT / "docs" / "fidelity-table.md").read_text()
    assert len(table) == 9 and all(line in doc for line in table)
