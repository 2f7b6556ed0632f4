"""bench/device_run.sh's stages name real builds, targets and tests (dry run, CPU only).

A device call is scarce (a refused start costs minutes of the session's 30); a stage that names a variant that does
not exist, a profile target the tools refuse, or a pytest `-k` that selects nothing wastes it or, worse, "passes"
without running anything. VC_DEVICE_DRY_RUN=1 makes every step print its command instead of running it; this reads
those commands back and checks each name with the same code the GPU run would use.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vc_attention.bench import kernel_profile
from vc_attention.bench.mma_variants import variant_flags

ROOT = Path(__file__).resolve().parents[1]
# the stages of the portable-kernel work (issue 12) and the default run's test stages; the older Hopper stages drive
# bench/sm90_variants.sh, whose names that script checks itself
STAGES = ("build", "tests", "variant_tests", "stages", "sites", "vf16", "v128", "adopt46", "candidates", "direct",
          "adopted", "restore", "latembar")


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    out = tmp_path_factory.mktemp("dry")
    env = dict(os.environ, OUT=str(out), VC_DEVICE_DRY_RUN="1")
    done = subprocess.run(["bash", "bench/device_run.sh", *STAGES], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = {}
    for line in (out / "steps.txt").read_text().splitlines():
        match = re.fullmatch(r"\[(\w+)\] DRY (.*)", line)
        if match:
            steps[match.group(1)] = shlex.split(match.group(2))
    return steps


def _option(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_dry_run_prints_every_stage_without_running_it(commands):
    assert {"build", "gpu_tests", "variant_tests", "stages_d64", "sites_d64"} <= set(commands)
    assert commands["build"] == ["python3", "-m", "vc_attention.cli", "build"]


def test_every_variant_a_stage_builds_or_times_exists(commands):
    checked = 0
    for step, argv in commands.items():
        names = _option(argv, "--variants") or _option(argv, "--only")
        if not names or not any(a.endswith(("mma_variants.py", "build_mma_variants.py")) for a in argv):
            continue
        for name in names.split(","):
            variant_flags(name)  # raises on an unknown name or a '+' part that is not a -D flag
            checked += 1
    assert checked >= 10


def test_every_profile_target_parses(commands):
    checked = 0
    for step, argv in commands.items():
        if any(a.endswith(("kernel_profile.py", "stall_sites.py")) for a in argv) and "--targets" in argv:
            for target in _option(argv, "--targets").split(","):
                kernel_profile.parse_target(target)  # ValueError names what is wrong
                checked += 1
    assert checked >= 6


def _pytest_steps(commands):
    return {step: argv[argv.index("pytest") + 1:] for step, argv in commands.items()
            if "pytest" in argv and "-k" in argv}


def test_every_test_selection_selects_tests(commands):
    """A `-k` that matches nothing would make the step pass without a test; collect each on the CPU (the GPU tests
    collect here and skip when run)."""
    steps = _pytest_steps(commands)
    assert steps
    for step, args in steps.items():
        kept, skip = [], False
        for arg in args:
            if skip:
                skip = False
                continue
            if arg in ("-n", "-p"):
                skip = True
                continue
            if arg.startswith("--junitxml") or arg in ("-q", "-rf", "-rfE"):
                continue
            kept.append(arg)
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *kept],
                              cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        counts = re.search(r"(\d+)(?:/\d+)? tests? collected", done.stdout)
        assert counts and int(counts.group(1)) > 0, f"{step}: `-k` selects no test\n{done.stdout[-1500:]}"
