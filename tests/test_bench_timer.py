"""The benchmarks' one timer (commands/bench.cuda_time_ms): how many calls it times (CPU, fake CUDA events)."""
import pytest
import torch

from vc_attention.commands.bench import cuda_time_ms


@pytest.fixture
def fake_events(monkeypatch):
    """CUDA events whose elapsed time is the next value of `durations` (ms); counts the calls timed."""
    state = {"durations": [], "calls": 0}

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return state["durations"][(state["calls"] - 1) % len(state["durations"])]

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return state


def _fn(state):
    def call():
        state["calls"] += 1
    return call


def test_a_long_call_is_timed_reps_times(fake_events):
    fake_events["durations"] = [20.0]
    assert cuda_time_ms(_fn(fake_events), 10, warmup=1, min_total_ms=100.0) == 20.0
    assert fake_events["calls"] == 1 + 10


def test_a_short_call_repeats_until_the_total_is_reached(fake_events):
    fake_events["durations"] = [0.5]
    cuda_time_ms(_fn(fake_events), 10, warmup=1, min_total_ms=100.0)
    assert fake_events["calls"] == 1 + 200  # 100 ms / 0.5 ms


def test_the_repeats_stop_at_max_reps_and_the_median_is_of_all_calls(fake_events):
    fake_events["durations"] = [0.1, 0.3]
    got = cuda_time_ms(_fn(fake_events), 10, warmup=0, min_total_ms=100.0, max_reps=50)
    assert fake_events["calls"] == 50
    assert got == pytest.approx(0.2)  # the median of 25 x 0.1 and 25 x 0.3


def test_without_a_total_the_count_is_reps(fake_events):
    fake_events["durations"] = [0.5]
    cuda_time_ms(_fn(fake_events), 7, warmup=2)
    assert fake_events["calls"] == 2 + 7
