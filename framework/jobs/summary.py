"""The end-of-job summary: counts, latency percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from adaptive_decoding.framework.tasks.prompts import LineProblem


# ---------------------------------------------------------------------------------- summary
def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile: the smallest value with at least q% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class JobSummary:
    """What one run of a job did.

    ``status`` is ``"completed"``, ``"interrupted"`` (Ctrl-C) or ``"job_timeout"``; ``pending``
    items have no row yet and run when the same job is started again.
    """

    output: str
    status: str = "completed"
    total: int = 0
    already_done: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    fallbacks: int = 0
    step_fallbacks: int = 0
    pending: int = 0
    oom_events: int = 0
    bisections: int = 0
    batch_size_start: int = 0
    batch_size_final: int = 0
    batch_size_min: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    skipped: list[LineProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list, repr=False)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def latency(self, q: float) -> Optional[float]:
        return percentile(self.latencies, q)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in (
            "output", "status", "total", "already_done", "done", "failed", "retried", "fallbacks",
            "step_fallbacks", "pending",
            "oom_events", "bisections", "batch_size_start", "batch_size_final", "batch_size_min", "tokens",
            "elapsed_s", "notes")}
        out["skipped"] = [str(p) for p in self.skipped]
        out["tokens_per_second"] = self.tokens_per_second
        out.update({f"latency_p{q}_s": self.latency(q) for q in (50, 95, 99)})
        return out

    def format(self) -> str:
        def ms(v: Optional[float]) -> str:
            return "-" if v is None else f"{1000 * v:.1f} ms"

        lines = [
            f"generate: {self.status} -> {self.output}",
            f"  items {self.total}: done {self.done}, failed {self.failed}, "
            f"already in output {self.already_done}, "
            f"pending {self.pending}, skipped bad lines {len(self.skipped)}",
            f"  retried {self.retried}, fallbacks {self.fallbacks} (+{self.step_fallbacks} lookahead steps), "
            f"OOM back-offs {self.oom_events}, "
            f"bisections {self.bisections}, batch size {self.batch_size_start} -> {self.batch_size_final} "
            f"(min {self.batch_size_min})",
            f"  {self.tokens} tokens in {self.elapsed_s:.2f} s = {self.tokens_per_second:.1f} tokens/s; "
            f"latency per item P50 {ms(self.latency(50))}, P95 {ms(self.latency(95))}, "
            f"P99 {ms(self.latency(99))}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        if self.pending:
            lines.append(f"  {self.pending} items have no row yet: run the same command again to resume "
                         f"(rows already in {self.output} are kept, only the pending items run)")
        return "\n".join(lines)
