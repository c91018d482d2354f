"""What the code runs on: library versions, the machine, and the time and peak memory of pipeline stages
(a background thread samples RSS)."""

from __future__ import annotations

import os
import platform
import re
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def machine() -> dict:
    """The processor's model name (what decides the float kernels; the architecture where it is unknown) and
    torch's thread count: what a trained key's bits can depend on."""
    import torch

    try:
        with open("/proc/cpuinfo") as fh:
            found = re.search(r"^model name\s*:\s*(.+)$", fh.read(), re.M)
    except OSError:
        found = None
    return {"cpu": found.group(1).strip() if found else platform.machine(), "threads": torch.get_num_threads()}


@contextmanager
def thread_count(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` within the block, restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def current_rss_mb() -> float:
    """Resident set size of this process now (Linux /proc), else the peak so far."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class StageMonitor:
    """Record seconds and peak RSS (MiB) of named stages.

    >>> monitor = StageMonitor()
    >>> with monitor.stage("load"):
    ...     pass
    >>> sorted(monitor.seconds)
    ['load']
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.seconds: dict[str, float] = {}
        self.peak_rss_mb: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        peak = [current_rss_mb()]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(self.interval):
                peak[0] = max(peak[0], current_rss_mb())

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        start = time.perf_counter()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.seconds[name] = round(time.perf_counter() - start, 3)
            self.peak_rss_mb[name] = round(max(peak[0], current_rss_mb()), 1)


@contextmanager
def add_seconds(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall seconds of the block to ``seconds[name]`` (a stage that runs many times sums up)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start


def sum_seconds(entries: list[dict[str, float]]) -> dict[str, float]:
    """Each stage's seconds summed over ``entries`` (stage -> seconds dicts, e.g. one per invocation), to 1 ms.

    The sum is rounded once, at the end: rounding each step would drop a stage whose every entry is short."""
    totals: dict[str, float] = {}
    for seconds in entries:
        for stage, value in seconds.items():
            totals[stage] = totals.get(stage, 0.0) + value
    return {stage: round(value, 3) for stage, value in totals.items()}


def versions() -> dict[str, str]:
    import numpy
    import sklearn
    import torch
    import transformers

    from openstamp import __version__

    return {
        "openstamp": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "scikit-learn": sklearn.__version__,
    }
