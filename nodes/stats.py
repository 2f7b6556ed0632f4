"""Per-run statistics of one VC-Attention node: counts, sampled timing, the log line, the UI event.

Timing is sampled: the second and then every SAMPLE_EVERY-th VC call of each attention shape is
bracketed by two CUDA events (on CPU by perf_counter, where ops run synchronously), and the events
are read only when the run ends, so no call waits for the GPU. The first call of a shape is left
out: it may include a kernel build or load. At the second call the model's own attention function
also runs twice on the same inputs, the second (warm) run timed the same way: the baseline of
est_speedup (two extra calls per shape and run: 2 in 3,200 calls for Wan2.2-14B, 40 steps, CFG).

NaN and Inf inputs are counted, not fallen back from: in our quantizers one NaN in q spreads over
its 64-row scale block where the model's attention keeps it to its row (in k both lose most of the
head, in v the channel); but the next layer's attention spreads any NaN token over every row
anyway, so falling back would not save the image, and deciding per call would cost a host sync per
call. The first and then every SAMPLE_EVERY-th VC call gets a min/max of q, k and v (one read each,
no full-size temporary) whose verdict is kept on the device and read when the run ends; the log
then says the model produced them before attention.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Callable, Optional

import torch

SAMPLE_EVERY = 8
EVENT_NAME = "vc_attention.stats"


class _Timer:
    """Start/stop around a region; elapsed_ms() may synchronize and is only called at run end."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._stop = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> "_Timer":
        if self._cuda:
            self._stop.record()
        else:
            self._t1 = time.perf_counter()
        return self

    def elapsed_ms(self) -> float:
        if self._cuda:
            self._stop.synchronize()
            return self._start.elapsed_time(self._stop)
        return (self._t1 - self._t0) * 1e3


class RunStats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.backend_calls: Counter = Counter()
        self.fallbacks: Counter = Counter()
        self.grouping_calls = 0
        self.sigmas: set[float] = set()
        self._calls_per_shape: Counter = Counter()
        self._vc_timers: dict[tuple, list[_Timer]] = {}
        self._baseline_timers: dict[tuple, _Timer] = {}
        self._logged_details: set[str] = set()
        self.cache_evictions = 0  # grouping cache entries replaced within the run (nodes/cache.py)
        self.checked_calls = 0
        self._finite_candidates = 0
        self._nonfinite: Optional[torch.Tensor] = None  # count on the device, read at run end

    def fallback(self, reason: str, detail: Optional[str] = None) -> None:
        """Count a call sent to the model's own attention; log the detail once per run."""
        self.fallbacks[reason] += 1
        if detail and detail not in self._logged_details:
            self._logged_details.add(detail)
            logging.info(f"VC-Attention: using the model's attention ({reason}): {detail}")

    def check_finite(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """On the first and every SAMPLE_EVERY-th VC call, note on the device whether q, k or v
        holds a NaN or an Inf (a min/max of each propagates both); nothing waits for the GPU."""
        self._finite_candidates += 1
        if (self._finite_candidates - 1) % SAMPLE_EVERY:
            return
        self.checked_calls += 1
        extremes = torch.stack([x.float() for t in (q, k, v) for x in torch.aminmax(t)])
        bad = (~torch.isfinite(extremes)).any().int()
        self._nonfinite = bad if self._nonfinite is None else self._nonfinite + bad

    def timed_vc_call(self, shape: tuple, device: torch.device, run: Callable[[], torch.Tensor],
                      baseline: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run the VC call `run`, timing it if sampled; time `baseline` once per shape and run.

        The first call of a shape is never timed (it may include a kernel build or load). At the
        second, the baseline runs twice and only its second, warm run is timed.
        """
        self._calls_per_shape[shape] += 1
        n = self._calls_per_shape[shape]
        if n == 2:
            baseline()
            timer = _Timer(device)
            baseline()
            self._baseline_timers[shape] = timer.stop()
        if n < 2 or (n - 2) % SAMPLE_EVERY:
            return run()
        timer = _Timer(device)
        out = run()
        self._vc_timers.setdefault(shape, []).append(timer.stop())
        return out

    def payload(self, node_id: str) -> dict:
        """The event the web extension reads (reads the timers: call it when the run has ended).

        attention_ms: mean time of one VC call (grouping included, at the rate it happened).
        est_speedup: estimated total time of the model's attention over VC's for the calls VC ran,
        per shape: calls x the model attention's time on that shape / calls x mean VC time.
        """
        vc_ms = {shape: [t.elapsed_ms() for t in timers] for shape, timers in self._vc_timers.items()}
        base_ms = {shape: t.elapsed_ms() for shape, t in self._baseline_timers.items()}
        sampled = [ms for times in vc_ms.values() for ms in times]
        total_base = sum(self._calls_per_shape[s] * base_ms[s] for s in vc_ms)
        total_vc = sum(self._calls_per_shape[s] * sum(t) / len(t) for s, t in vc_ms.items())
        return {
            "node_id": str(node_id),
            "backend_calls": dict(self.backend_calls),
            "fallbacks": dict(self.fallbacks),
            "grouping_calls": self.grouping_calls,
            "attention_ms": sum(sampled) / len(sampled) if sampled else 0.0,
            "sampled_calls": len(sampled),
            "steps": len(self.sigmas),
            "est_speedup": total_base / total_vc if total_vc > 0 else None,
            "cache_evictions": self.cache_evictions,
            "checked_calls": self.checked_calls,
            "nonfinite_calls": 0 if self._nonfinite is None else int(self._nonfinite),
        }

    @staticmethod
    def log_line(payload: dict) -> str:
        calls = ", ".join(f"{n} on {name}" for name, n in sorted(payload["backend_calls"].items())) or "none"
        falls = ", ".join(f"{n} {reason}" for reason, n in sorted(payload["fallbacks"].items())) or "none"
        speed = "n/a" if payload["est_speedup"] is None else f"{payload['est_speedup']:.2f}x"
        return (
            f"VC-Attention (node {payload['node_id']}): VC calls {calls}; model attention {falls}; "
            f"{payload['grouping_calls']} groupings over {payload['steps']} steps; "
            f"{payload['attention_ms']:.3f} ms per VC call ({payload['sampled_calls']} timed); "
            f"est. speed-up over the model's attention {speed}"
        ) + (_eviction_note(payload) if payload.get("cache_evictions") else "") + (
            _nonfinite_note(payload) if payload.get("nonfinite_calls") else "")


def _eviction_note(payload: dict) -> str:
    return (f"; {payload['cache_evictions']} cached groupings replaced (the CFG batching, token count or batch "
            "size changed within the run)")


def _nonfinite_note(payload: dict) -> str:
    return (
        f"; {payload['nonfinite_calls']} of {payload['checked_calls']} checked VC calls had NaN or Inf in q, k "
        "or v: the model produced them before attention (an fp16 overflow upstream?), and the output of those "
        "layers is not usable with any attention"
    )


def publish(payload: dict) -> None:
    """One log line, and the event to the front end when a ComfyUI server is running."""
    logging.info(RunStats.log_line(payload))
    try:
        from server import PromptServer  # ComfyUI's server module; absent when used as a library
    except ImportError:
        return
    instance = getattr(PromptServer, "instance", None)
    if instance is not None:
        instance.send_sync(EVENT_NAME, payload)
