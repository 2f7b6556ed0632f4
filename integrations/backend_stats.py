"""What the diffusers backend did: calls per kernel, fallbacks per reason, groupings made and reused."""
from __future__ import annotations

from collections import Counter


class BackendStats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.kernel_calls: Counter = Counter()  # kernel backend name -> calls it ran
        self.fallbacks: Counter = Counter()  # reason -> calls handed to diffusers' native attention
        self.groupings = 0  # k-means groupings computed
        self.reused_groupings = 0  # calls that reused a cached grouping
        self.ulysses_calls = 0  # kernel calls made inside diffusers' Ulysses exchange (H/P heads each)

    @property
    def calls(self) -> int:
        return sum(self.kernel_calls.values()) + sum(self.fallbacks.values())

    def __str__(self) -> str:
        ran = ", ".join(f"{n} on {name}" for name, n in sorted(self.kernel_calls.items())) or "none on our kernels"
        lines = [f"VC-Attention (diffusers): {self.calls} attention calls, {ran}; "
                 f"{self.groupings} groupings computed, {self.reused_groupings} reused"
                 + (f"; {self.ulysses_calls} under Ulysses context parallel." if self.ulysses_calls else ".")]
        lines += [f"  {n} to diffusers' native attention: {reason}" for reason, n in self.fallbacks.most_common()]
        return "\n".join(lines)
