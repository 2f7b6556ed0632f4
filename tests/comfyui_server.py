"""Starts ComfyUI's server as `python main.py ARGS` does, after tests/comfyui_pyav.py's PyAV option
(tests/test_browser.py's server fixture runs it with the ComfyUI checkout as working directory)."""
import os
import runpy
import sys

import comfyui_pyav  # beside this script (sys.path[0] is its folder)

if comfyui_pyav.install_if_allowed():
    print("comfyui_server: PyAV is missing; `import av` gives the named placeholders (VC_PYAV_PLACEHOLDER=1)",
          file=sys.stderr, flush=True)
sys.path[0] = os.getcwd()  # what `python main.py` puts first: the checkout
sys.argv = ["main.py"] + sys.argv[1:]
runpy.run_path("main.py", run_name="__main__")
