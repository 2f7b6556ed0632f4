"""Which way of raising from a torch extension ends the process on this machine (the cause of section 30's crash).

Session 20 found that refusals of the sm90 `attention` binding and of `prepare_attend` formatted with an integer
argument ended the process with SIGSEGV on the H200 while plain sentences raised ValueError. This builds a minimal
extension (bench/probe/) twice, as the C++ file alone and with an nvcc-compiled .cu beside it under the project's
flags (kernels/jit.py), and runs each way of raising in a process of its own, also with the project's sm90 and
prepare extensions loaded first. Prints one line per case (exit status, exception) and a JSON file under --out.

    python3 bench/refusal_probe.py --out $OUT [--preload none ours]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "probe"
CASES = ("value_plain", "value_int", "check_int", "value_string", "ostream_int", "c10_str_int", "std_throw")
CHILD = r'''
import sys
build, preload, case = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
if preload == "ours":
    from vc_attention.kernels import backend_sm90, prepare_cuda
    backend_sm90.extension(); prepare_cuda.extension()
from vc_attention.bench.refusal_probe import extension
ext = extension(build)
try:
    print("returned", repr(getattr(ext, case)(3)))
except (ValueError, RuntimeError) as err:
    print(type(err).__name__, str(err).splitlines()[0])
'''


def extension(build: str):
    """The probe extension: 'cpp' (the binding alone) or 'cu' (with an nvcc object, the project's flags)."""
    from vc_attention.kernels import jit
    sources = [HERE / "refusal_probe.cpp"] + ([HERE / "refusal_probe_device.cu"] if build == "cu" else [])
    return jit.load_extension(f"vc_refusal_probe_{build}", sources)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--preload", nargs="+", default=["none", "ours"], choices=["none", "ours"],
                        help="ours: load the project's sm90 and prepare extensions (JIT-built) before the probe")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for build in ("cpp", "cu"):  # build once in this process so the children only load
        extension(build)
    rows = []
    for build in ("cpp", "cu"):
        for preload in args.preload:
            for case in CASES:
                proc = subprocess.run([sys.executable, "-c", CHILD, build, preload, case], capture_output=True, text=True,
                                      timeout=300)
                said = (proc.stdout.strip().splitlines() or [""])[-1]
                rows.append({"build": build, "preload": preload, "case": case, "rc": proc.returncode, "said": said,
                             "stderr_tail": proc.stderr[-400:] if proc.returncode else ""})
                print(f"{build:4s} {preload:5s} {case:13s} rc={proc.returncode:4d} {said}", flush=True)
    import torch
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               command="python3 bench/refusal_probe.py --preload " + " ".join(args.preload))
    (args.out / "refusal_probe.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))


if __name__ == "__main__":
    main()
