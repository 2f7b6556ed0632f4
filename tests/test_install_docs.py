"""What the README promises a new user about installing and testing is what is true today."""
import os
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
INSTALL = README.split("## Install", 1)[1].split("\n## ", 1)[0]
SETUP = ROOT / "tests" / "setup_real_host.sh"


def test_install_section_says_what_works_and_claims_no_registry():
    assert "custom_nodes" in INSTALL and "requirements.txt" in INSTALL and "restart ComfyUI" in INSTALL
    assert "not published" in INSTALL
    # the pack is in no registry and no public repository holds it yet
    assert 'search "VC-Attention"' not in INSTALL and "git clone https://" not in INSTALL


def test_registry_metadata_is_ready_for_publishing():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    comfy = meta["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"] and comfy["requires-comfyui"]
    assert meta["project"]["urls"]["Repository"] and meta["project"]["version"]


def test_readme_says_how_to_set_up_the_real_host_tiers():
    assert "bash tests/setup_real_host.sh" in README and "skip unless" in README
    assert SETUP.is_file() and os.access(SETUP, os.X_OK)


def _setup(env_changes, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COMFYUI_PATH"} | env_changes
    return subprocess.run(["bash", str(SETUP), "--setup-only"], capture_output=True, text=True, env=env,
                          timeout=60, cwd=tmp_path)


def test_setup_script_refuses_without_a_comfyui_checkout_before_installing_anything(tmp_path):
    missing = _setup({}, tmp_path)
    assert missing.returncode == 2 and "set COMFYUI_PATH" in missing.stderr
    not_comfy = _setup({"COMFYUI_PATH": str(tmp_path)}, tmp_path)
    assert not_comfy.returncode == 2 and "is not a ComfyUI checkout" in not_comfy.stderr
    assert "==" not in not_comfy.stdout  # stopped before the install steps


def test_no_stale_never_ran_statements_about_the_gpu_tiers():
    docs = {p.name: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}
    stale = ("Not yet run on a GPU", "written without GPU access in\n  this session: not yet run",
             "this branch has not yet been run on a GPU", "pytest GPU tier was last\nrun on the build before")
    for name, text in docs.items():
        for phrase in stale:
            assert phrase not in text, (name, phrase)
