"""bench/host_overhead.py's host-side parts on the CPU (its GPU parts run in the device runs)."""
import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("host_overhead", Path(__file__).resolve().parents[1] / "bench" / "host_overhead.py")
host_overhead = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(host_overhead)


def _busy():
    return sum(i * i for i in range(200))


def test_the_profile_table_starts_at_its_header_and_names_the_hot_function():
    lines = host_overhead._top_functions(_busy, reps=50, top=5)
    assert lines[0].lstrip().startswith("ncalls")
    assert any("_busy" in line or "genexpr" in line for line in lines[1:])
    assert len(lines) <= 1 + 5
