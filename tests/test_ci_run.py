"""`.ci/run` stops loudly on a machine without nvcc (the compile-only tests would only skip there)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CI_RUN = Path(__file__).resolve().parents[1] / ".ci" / "run"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_ci_run_fails_without_nvcc_before_installing_anything(tmp_path):
    bare_path = os.pathsep.join(d for d in ("/usr/bin", "/bin") if not (Path(d) / "nvcc").exists())
    env = {"PATH": bare_path, "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(CI_RUN)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "CI needs nvcc" in result.stderr and "pip" not in result.stdout + result.stderr
