"""Per-run statistics of one VC-Attention node: counts, sampled timing, the log line, the UI event,
and the per-shape verdict "VC-Attention is slower than the model's attention here".

Timing is sampled and never waits for the GPU. Per attention shape:
- call 1 runs VC-Attention untimed (it may include a kernel build or load);
- calls 2 and 3 run the model's own attention INSTEAD of VC-Attention's (its output is a valid output,
  so the baseline costs no extra attention call; the grouping still runs, so the per-layer cache is
  the same as without the baseline): call 2 warms it up, call 3 is timed. The baseline is kept for the
  process, by shape, dtype, device and model attention (`baseline_id`): a later run there reuses it and
  runs VC-Attention on calls 2 and 3 too (at Wan2.2-14B 720p the two baseline calls cost ~0.4 s a run);
- call 4 and then every SAMPLE_EVERY-th VC call are timed with three CUDA events (on CPU
  perf_counter, where ops run synchronously): start, after the grouping / permutation, end.
Events are read when they have completed (Event.query(), non-blocking) at later calls of the same
shape, and all of them when the run ends. Once a shape has MIN_VC_SAMPLES timed VC calls and its
baseline, its VC cost per call is estimated as attention + grouping x the run's grouping rate +
permutation reuse x the rest (the grouping runs on the first part of the steps only); when that is
above the model's attention time the shape is "slower" (nodes/patch.py decides what to do).

NaN and Inf inputs are counted, not fallen back from: in our quantizers one NaN in q stays in its
row (one scale per row, as in the model's attention; in k both lose most of the head, in v the
channel); but the next layer's attention spreads any NaN token over every row
anyway, so falling back would not save the image, and deciding per call would cost a host sync per
call. The first and then every SAMPLE_EVERY-th VC call gets a min/max of q, k and v (one read each,
no full-size temporary) whose verdict is kept on the device and read when the run ends; the log
then says the model produced them before attention.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional

import torch

SAMPLE_EVERY = 8
MIN_VC_SAMPLES = 2
EVENT_NAME = "vc_attention.stats"

# The model attention's time per call, measured by earlier runs of this process: baseline_id -> ms.
# Bounded (oldest first out): a server that sees many resolutions keeps the recent ones.
_BASELINES: dict[Hashable, float] = {}
BASELINES_KEPT = 64


def _remember_baseline(baseline_id: Optional[Hashable], ms: float) -> None:
    if baseline_id is None:
        return
    _BASELINES.pop(baseline_id, None)
    _BASELINES[baseline_id] = ms
    while len(_BASELINES) > BASELINES_KEPT:
        del _BASELINES[next(iter(_BASELINES))]


def forget_baselines() -> None:
    """Drop the process's remembered baselines (the next run at each shape measures again)."""
    _BASELINES.clear()


class _Timer:
    """Marks on the device's timeline; a mark's time is read only once the GPU has passed it."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._marks: list = []
        self.mark()

    def mark(self) -> "_Timer":
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())
        return self

    def done(self) -> bool:
        """Whether every mark has completed (never blocks)."""
        return not self._cuda or self._marks[-1].query()

    def intervals_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (synchronizes if the marks are not done yet)."""
        if self._cuda:
            self._marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(self._marks, self._marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self._marks, self._marks[1:])]


@dataclass
class _ShapeStats:
    calls: int = 0  # eligible calls at this shape (VC and baseline)
    baseline_id: Optional[Hashable] = None  # where the measured baseline is remembered for later runs
    baseline_reused: bool = False  # baseline_ms comes from an earlier run: no baseline calls in this one
    baseline_calls: int = 0  # calls of this run that the model's attention ran for the baseline
    baseline: Optional[_Timer] = None
    baseline_ms: Optional[float] = None
    pending: list = field(default_factory=list)  # (timer, grouped) not yet read
    grouping_ms: list = field(default_factory=list)  # group phase of sampled calls that ran k-means
    reuse_ms: list = field(default_factory=list)  # group phase of sampled calls that reused a grouping
    attention_ms: list = field(default_factory=list)
    slower: bool = False

    def fold(self, wait: bool) -> None:
        """Read the finished timers (all of them if `wait`)."""
        if self.baseline is not None and (wait or self.baseline.done()):
            self.baseline_ms = self.baseline.intervals_ms()[0]
            self.baseline = None
            _remember_baseline(self.baseline_id, self.baseline_ms)
        keep = []
        for timer, grouped in self.pending:
            if not (wait or timer.done()):
                keep.append((timer, grouped))
                continue
            group_ms, attention_ms = timer.intervals_ms()
            (self.grouping_ms if grouped else self.reuse_ms).append(group_ms)
            self.attention_ms.append(attention_ms)
        self.pending = keep

    @property
    def samples(self) -> int:
        return len(self.attention_ms)

    def vc_ms(self, grouping_rate: float) -> Optional[float]:
        """Estimated mean VC call time over the run, grouping included at its rate, or None."""
        if not self.attention_ms:
            return None
        return (_mean(self.attention_ms) + grouping_rate * _mean(self.grouping_ms)
                + (1.0 - grouping_rate) * _mean(self.reuse_ms))

    @property
    def vc_calls(self) -> int:
        return self.calls - self.baseline_calls

    def judge(self, grouping_rate: float) -> bool:
        vc = self.vc_ms(grouping_rate)
        if self.baseline_ms is not None and vc is not None and self.samples >= MIN_VC_SAMPLES:
            self.slower = vc > self.baseline_ms
        return self.slower


def _mean(values: list) -> float:
    return sum(values) / len(values) if values else 0.0


def shape_name(shape: tuple) -> str:
    return "x".join(str(s) for s in shape)


class RunStats:
    def __init__(self, grouping_rate: float = 0.0) -> None:
        self.grouping_rate = grouping_rate  # expected share of VC calls that run a k-means grouping
        self.reset()

    def reset(self) -> None:
        self.backend_calls: Counter = Counter()
        self.fallbacks: Counter = Counter()
        self.grouping_calls = 0
        self.baseline_calls = 0
        self.sigmas: set[float] = set()
        self._shapes: dict[tuple, _ShapeStats] = {}
        self._logged_details: set[str] = set()
        self.cache_evictions = 0  # grouping cache entries replaced within the run (nodes/cache.py)
        self.checked_calls = 0
        self._finite_candidates = 0
        self._nonfinite: Optional[torch.Tensor] = None  # count on the device, read at run end
        # calls whose backend ran the configuration without a refinement it lacks (the fidelity preset's mixed encoding
        # and second V term on the portable kernel or at head dim 64: kernels/api.REFINEMENTS_DROPPED, process-wide,
        # read as a difference so that the run's own calls are counted with no work per call)
        from ..kernels import api
        self._dropped_before = Counter(api.REFINEMENTS_DROPPED)

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

    def refinements_dropped(self) -> dict[str, int]:
        """'backend: configuration it ran' -> calls in this run (since reset) that ran without a refinement."""
        from ..kernels import api
        diff = Counter(api.REFINEMENTS_DROPPED)
        diff.subtract(self._dropped_before)
        return {f"{name}: {tag}": n for (name, tag), n in sorted(diff.items()) if n > 0}

    def is_slower(self, shape: tuple) -> bool:
        """Whether VC-Attention (grouping included) measured slower than the model's attention at
        this shape so far in the run (reads finished timers only: never waits for the GPU)."""
        stats = self._shapes.get(shape)
        if stats is None:
            return False
        stats.fold(wait=False)
        return stats.judge(self.grouping_rate)

    def run_call(self, shape: tuple, device: torch.device, group: Callable[[], Optional[torch.Tensor]],
                 attend: Callable[[Optional[torch.Tensor]], torch.Tensor],
                 model: Callable[[], torch.Tensor], baseline_id: Optional[Hashable] = None) -> tuple[torch.Tensor, bool]:
        """One eligible call: attend(group()) (timed if sampled), or the model's attention `model`
        where the baseline is due. Returns (output, True if the model's attention produced it).
        baseline_id: what the model attention's time depends on (shape, dtype, device, which attention);
        an earlier run's baseline there stands in for this run's (None: always measure)."""
        stats = self._shapes.get(shape)
        if stats is None:
            stats = self._shapes[shape] = _ShapeStats(baseline_id=baseline_id)
            known = _BASELINES.get(baseline_id) if baseline_id is not None else None
            if known is not None:
                stats.baseline_ms, stats.baseline_reused = known, True
        stats.calls += 1
        n = stats.calls
        if n in (2, 3) and not stats.baseline_reused:
            self.baseline_calls += 1
            stats.baseline_calls += 1
            group()  # the layer's grouping stays as if VC-Attention had run (the cache, later steps)
            if n == 2:
                return model(), True
            timer = _Timer(device)
            out = model()
            stats.baseline = timer.mark()
            return out, True
        if n < 4 or (n - 4) % SAMPLE_EVERY:
            return attend(group()), False
        groupings_before = self.grouping_calls
        timer = _Timer(device)
        perm = group()
        timer.mark()
        out = attend(perm)
        stats.pending.append((timer.mark(), self.grouping_calls > groupings_before))
        return out, False

    def payload(self, node_id: str, kept_slower: bool = False, cross: Optional[tuple[dict, list]] = None) -> dict:
        """The event the web extension reads (reads every timer: call it when the run has ended).

        attention_ms: mean time of one sampled VC call (grouping included, at the rate it happened).
        est_speedup: the model attention's time over VC's for the calls VC ran, per shape: VC calls x
        the model attention's time on that shape / VC calls x the estimated VC time (vc_ms).
        grouping_share: grouping and permutation time / VC attention time over the sampled calls.
        slower_shapes: shapes where VC-Attention measured slower than the model's attention;
        kept_slower: VC-Attention kept running there (fidelity, custom), else the model's did.
        baseline_reused: shapes whose model-attention time came from an earlier run of this process.
        cross: (calls per route, shapes where cuDNN measured slower) of the exact cross-attention
        (nodes/cross_attention.py), sent as cross_attention / cross_slower_shapes.
        """
        total_base = total_vc = group_ms = attention_ms = 0.0
        sampled = 0
        for stats in self._shapes.values():
            stats.fold(wait=True)
            stats.judge(self.grouping_rate)
            group_ms += sum(stats.grouping_ms) + sum(stats.reuse_ms)
            attention_ms += sum(stats.attention_ms)
            sampled += stats.samples
            vc = stats.vc_ms(self.grouping_rate)
            if vc is not None and stats.baseline_ms is not None:
                total_base += stats.vc_calls * stats.baseline_ms
                total_vc += stats.vc_calls * vc
        all_ms = group_ms + attention_ms
        return {
            "node_id": str(node_id),
            "backend_calls": dict(self.backend_calls),
            "fallbacks": dict(self.fallbacks),
            "grouping_calls": self.grouping_calls,
            "baseline_calls": self.baseline_calls,
            "attention_ms": all_ms / sampled if sampled else 0.0,
            "sampled_calls": sampled,
            "steps": len(self.sigmas),
            "est_speedup": total_base / total_vc if total_vc > 0 else None,
            "cache_evictions": self.cache_evictions,
            "checked_calls": self.checked_calls,
            "nonfinite_calls": 0 if self._nonfinite is None else int(self._nonfinite),
            "grouping_share": group_ms / all_ms if all_ms > 0 else None,
            "slower_shapes": [shape_name(s) for s, stats in self._shapes.items() if stats.slower],
            "kept_slower": kept_slower,
            "baseline_reused": sum(stats.baseline_reused for stats in self._shapes.values()),
            "cross_attention": dict(cross[0]) if cross else {},
            "cross_slower_shapes": list(cross[1]) if cross else [],
            "refinements_dropped": self.refinements_dropped(),
        }

    @staticmethod
    def log_line(payload: dict) -> str:
        calls = ", ".join(f"{n} on {name}" for name, n in sorted(payload["backend_calls"].items())) or "none"
        falls = ", ".join(f"{n} {reason}" for reason, n in sorted(payload["fallbacks"].items())) or "none"
        speed = "n/a" if payload["est_speedup"] is None else f"{payload['est_speedup']:.2f}x"
        share = "" if payload["grouping_share"] is None else f" ({100 * payload['grouping_share']:.1f}% of the VC attention time)"
        line = (
            f"VC-Attention (node {payload['node_id']}): VC calls {calls}; model attention {falls}; "
            f"{payload['grouping_calls']} groupings{share} over {payload['steps']} steps; "
            f"{payload['attention_ms']:.3f} ms per VC call ({payload['sampled_calls']} timed); "
            f"est. speed-up over the model's attention {speed}"
        )
        if payload["slower_shapes"]:
            action = "kept as chosen" if payload["kept_slower"] else "the model's attention ran there"
            line += f"; slower than the model's attention at {', '.join(payload['slower_shapes'])} ({action})"
        if payload.get("baseline_reused"):
            line += f"; the model attention's time from an earlier run at {payload['baseline_reused']} shape(s)"
        if payload.get("cross_attention"):
            line += _cross_note(payload)
        if payload.get("cache_evictions"):
            line += _eviction_note(payload)
        if payload.get("nonfinite_calls"):
            line += _nonfinite_note(payload)
        if payload.get("refinements_dropped"):
            line += _refinements_note(payload)
        return line


def _cross_note(payload: dict) -> str:
    routes = ", ".join(f"{n} {route}" for route, n in sorted(payload["cross_attention"].items()))
    slower = payload.get("cross_slower_shapes")
    return f"; cross-attention (exact): {routes}" + (f" (cuDNN slower at {', '.join(slower)})" if slower else "")


def _eviction_note(payload: dict) -> str:
    return (f"; {payload['cache_evictions']} cached groupings replaced (the CFG batching, token count or batch "
            "size changed within the run)")


def _refinements_note(payload: dict) -> str:
    ran = ", ".join(f"{n} as {what}" for what, n in payload["refinements_dropped"].items())
    return (f"; calls run without the fidelity refinements their kernel lacks (the mixed encoding, the V residual's "
            f"second term: the Hopper kernel at head dim 128 has them): {ran}")


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
