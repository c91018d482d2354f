"""The eval's clock: wall seconds per stage of each invocation, and the part each method's runs spent.

``out/timings.json`` holds one entry per invocation (by start time); ``record_timings`` rewrites this invocation's
entry and returns the sums over all of them. ``StageClock`` keeps the entry current while the eval works: it is
written after every stage and, while a stage runs, every ``every`` seconds from a background thread (with the
running stage's seconds so far), so an invocation killed in any way, SIGKILL included, loses at most that much.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openstamp.runtime import machine, sum_seconds
from openstamp.storage import atomic_write_json, read_json


def record_timings(
    out: Path, started: str, seconds: dict[str, float], untimed: bool = False, by_method: dict | None = None
) -> dict:
    """Write this invocation's stage seconds and machine into out/timings.json (one entry per invocation, by start
    time), with the part each method's runs spent (``by_method``: method -> stage -> seconds).

    Returns each stage's sum over every invocation so far, and per method (``methods``; what no method's run spent,
    the unwatermarked sets, the original's own perplexity and the oracle, is the rest); ``complete`` is False when
    the run directory held work done before timings were recorded (``untimed``), which the sums leave out.
    """
    path = out / "timings.json"
    history = [e for e in (read_json(path, "timings") if path.exists() else []) if e["started"] != started]
    entry = {"started": started, "seconds": {k: round(v, 3) for k, v in seconds.items()}, "machine": machine()}
    if by_method:
        entry["methods"] = by_method
    history.append({**entry, "untimed_earlier_work": True} if untimed else entry)
    atomic_write_json(path, history)
    machines = [e["machine"] for e in history if "machine" in e]
    return {
        **sum_timings([e["seconds"] for e in history], [e.get("methods", {}) for e in history]),
        "invocations": len(history),
        "machines": [m for i, m in enumerate(machines) if m not in machines[:i]],  # each processor and thread count
        "complete": not any(e.get("untimed_earlier_work") for e in history),
    }


def sum_timings(stages: list[dict[str, float]], methods: list[dict[str, dict[str, float]]]) -> dict:
    """``stages``: each stage's seconds summed over the entries; ``total``; ``methods``: per method, likewise."""
    totals = sum_seconds(stages)
    names = dict.fromkeys(name for entry in methods for name in entry)
    return {
        "stages": totals,
        "total": round(sum(totals.values()), 3),
        "methods": {name: sum_seconds([entry[name] for entry in methods if name in entry]) for name in names},
    }


class StageClock:
    """This invocation's seconds per stage (``stage``), and each method's part (``run``), kept in out/timings.json."""

    def __init__(self, out: Path, started: str, untimed: bool = False, every: float = 60.0) -> None:
        self.out, self.started, self.untimed, self.every = out, started, untimed, every
        self.seconds: dict[str, float] = {}
        self.by_method: dict[str, dict[str, float]] = {}
        self._stage: tuple[str, float] | None = None  # the running stage and when it began
        self._run: tuple[str, dict[str, float]] | None = None  # the running run's method and the seconds before it
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the block's wall seconds to stage ``name`` (a stage that runs many times sums up); save after it."""
        with self._lock:
            self._stage = (name, time.perf_counter())
        try:
            with self._saving():
                yield
        finally:
            with self._lock:
                self.seconds = self._now()
                self._stage = None
            self.save()

    @contextmanager
    def run(self, method: str) -> Iterator[None]:
        """Count the stages of the block as ``method``'s too."""
        with self._lock:
            self._run = (method, dict(self.seconds))
        try:
            yield
        finally:
            with self._lock:
                self.by_method = self._methods(self.seconds)
                self._run = None
            self.save()

    def save(self) -> dict:
        """Write this invocation's entry as it stands (the running stage with its seconds so far); return the sums."""
        with self._lock:
            seconds = self._now()
            return record_timings(self.out, self.started, seconds, self.untimed, self._methods(seconds))

    def _now(self) -> dict[str, float]:
        if self._stage is None:
            return dict(self.seconds)
        name, start = self._stage
        return {**self.seconds, name: self.seconds.get(name, 0.0) + time.perf_counter() - start}

    def _methods(self, seconds: dict[str, float]) -> dict[str, dict[str, float]]:
        if self._run is None:
            return self.by_method
        method, before = self._run
        spent = {k: v - before.get(k, 0.0) for k, v in seconds.items() if v > before.get(k, 0.0)}
        return {**self.by_method, method: sum_seconds([self.by_method.get(method, {}), spent])}

    @contextmanager
    def _saving(self) -> Iterator[None]:
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.every):
                self.save()

        thread = threading.Thread(target=loop, name="eval-timings", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
