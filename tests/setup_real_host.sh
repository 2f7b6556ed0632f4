#!/usr/bin/env bash
# Sets up and runs the real-host and browser test tiers against a ComfyUI checkout you already have
# (this script never downloads ComfyUI).
#
#   COMFYUI_PATH=/path/to/ComfyUI bash tests/setup_real_host.sh [--setup-only] [pytest arguments]
#
# 1. A virtual environment (VC_TEST_VENV, default ~/.cache/vc-attention/comfyui-test-venv) that sees
#    this Python's packages gets ComfyUI's requirements.txt, pytest and the `playwright` Python
#    package. Your torch is reused when the registry's torchvision / torchaudio accept it; otherwise
#    pip puts the torch they need into the environment (several GB with its CUDA libraries). Playwright's own browser download
#    is not used: the tests drive Debian's chromium package (/usr/bin/chromium), installed with apt
#    when missing.
# 2. pytest runs the tests marked `comfyui` (tests/test_real_comfyui.py, the real-host part of
#    tests/test_workflows.py, tests/test_browser.py) on THIS checkout, with COMFYUI_PYTHON set to the
#    environment's Python. Without COMFYUI_PATH those tests skip; a plain `pytest` never needs this.
set -euo pipefail

usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
REPO="$(cd "$(dirname "$0")/.." && pwd)"
SETUP_ONLY=0
if [ "${1:-}" = "--setup-only" ]; then SETUP_ONLY=1; shift; fi
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then usage; fi

if [ -z "${COMFYUI_PATH:-}" ]; then
  echo "setup_real_host: set COMFYUI_PATH to an existing ComfyUI checkout (the folder with main.py)." >&2
  exit 2
fi
COMFYUI_PATH="$(cd "$COMFYUI_PATH" && pwd)"
if [ ! -f "$COMFYUI_PATH/main.py" ] || [ ! -d "$COMFYUI_PATH/comfy" ] || [ ! -f "$COMFYUI_PATH/requirements.txt" ]; then
  echo "setup_real_host: $COMFYUI_PATH is not a ComfyUI checkout (no main.py, comfy/ or requirements.txt)." >&2
  exit 2
fi

PYTHON="${PYTHON:-python3}"
VENV="${VC_TEST_VENV:-$HOME/.cache/vc-attention/comfyui-test-venv}"
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "setup_real_host: $PYTHON has no torch; install PyTorch first (the venv reuses it)." >&2
  exit 2
fi

echo "== Debian's chromium (the browser the tests drive)"
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup_real_host: install chromium as root: apt-get install chromium" >&2; exit 2; }
    SUDO=sudo
  fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium
fi
/usr/bin/chromium --version

echo "== test environment: $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" -r "$COMFYUI_PATH/requirements.txt" pytest playwright matplotlib
"$VENV/bin/python" -c "import torch, torchvision, torchaudio, aiohttp, playwright; print('torch', torch.__version__)"

if [ "$SETUP_ONLY" = 1 ]; then
  echo "setup done; run again without --setup-only to run the tests."
  exit 0
fi

echo "== real-host and browser tiers"
# the tests import `vc_attention`: point that name at this checkout, whatever else is installed
LINK_DIR="$(mktemp -d)"
trap 'rm -rf "$LINK_DIR"' EXIT
ln -s "$REPO" "$LINK_DIR/vc_attention"
cd "$REPO"
COMFYUI_PATH="$COMFYUI_PATH" COMFYUI_PYTHON="$VENV/bin/python" PYTHONPATH="$LINK_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  "$VENV/bin/python" -m pytest -q -m comfyui tests/test_real_comfyui.py tests/test_workflows.py tests/test_browser.py "$@"
