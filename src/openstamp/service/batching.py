"""Micro-batching: concurrent requests share detection calls.

Requests wait in a bounded queue. One asyncio worker takes the oldest request, lets others
join it for at most ``max_wait_ms`` (or until ``max_batch`` texts), and runs one detection
call for all of them in a single worker thread, so the event loop stays free. A full queue
refuses new requests instead of growing, and ``close`` finishes every accepted request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# texts, prompts, token_scores -> one result per text
DetectFn = Callable[[list[str], list[str | None], bool], Sequence[Any]]


class QueueFull(Exception):
    """Too many requests are waiting; the client should retry later."""


class ServiceClosing(Exception):
    """The service is shutting down and accepts no new requests."""


@dataclass
class _Job:
    texts: list[str]
    prompts: list[str | None]
    token_scores: bool
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)


class MicroBatcher:
    """Run ``detect`` over batches of queued requests.

    Args:
        detect: scores texts; called from one worker thread only, never concurrently.
        max_batch: texts per call (a single larger request is run alone).
        max_wait_ms: how long the oldest request waits for others to join.
        max_queue: requests waiting; ``submit`` raises QueueFull beyond it.
    """

    def __init__(self, detect: DetectFn, *, max_batch: int, max_wait_ms: float, max_queue: int) -> None:
        self.detect, self.max_batch, self.max_queue = detect, max_batch, max_queue
        self.max_wait = max_wait_ms / 1000
        self._jobs: deque[_Job] = deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing = False
        self.calls = 0  # detection calls so far (for tests and metrics)

    @property
    def queued(self) -> int:
        return len(self._jobs)

    async def start(self) -> None:
        self._closing = False
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openstamp-detect")
        self._worker = asyncio.create_task(self._run(), name="openstamp-batcher")

    async def submit(self, texts: list[str], prompts: list[str | None], token_scores: bool) -> list[Any]:
        """Queue one request and wait for its results (one per text, in order)."""
        if self._closing or self._worker is None:
            raise ServiceClosing("the service is shutting down")
        if len(self._jobs) >= self.max_queue:
            raise QueueFull(f"{len(self._jobs)} requests are already waiting")
        job = _Job(list(texts), list(prompts), token_scores, asyncio.get_running_loop().create_future())
        self._jobs.append(job)
        self._wakeup.set()
        return await job.future

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` alone on the detection thread, between batches (a pooled request)."""
        if self._closing or self._executor is None:
            raise ServiceClosing("the service is shutting down")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def close(self) -> None:
        """Stop accepting requests, finish the accepted ones, then stop the worker."""
        self._closing = True
        if self._worker is not None:
            self._wakeup.set()
            await self._worker
            self._worker = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- worker ------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            while not self._jobs:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            await self._gather()
            batch = self._take()
            if batch:
                await self._process(batch)

    async def _gather(self) -> None:
        """Wait until the batch is full, the oldest job has waited max_wait, or we are closing."""
        deadline = self._jobs[0].enqueued + self.max_wait
        while not self._closing and sum(len(j.texts) for j in self._jobs) < self.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _take(self) -> list[_Job]:
        """Jobs from the front up to max_batch texts (at least one); abandoned jobs are dropped."""
        batch: list[_Job] = []
        n = 0
        while self._jobs:
            job = self._jobs[0]
            if job.future.done():  # the client went away
                self._jobs.popleft()
                continue
            if batch and n + len(job.texts) > self.max_batch:
                break
            batch.append(self._jobs.popleft())
            n += len(job.texts)
        return batch

    async def _process(self, batch: list[_Job]) -> None:
        try:
            results = await self._call(batch)
        except Exception as err:  # one bad request must not fail the others
            if len(batch) == 1:
                _settle(batch[0], error=err)
                return
            log.warning("a batch of %d requests failed (%s); scoring them one by one", len(batch), err)
            for job in batch:
                await self._process([job])
            return
        start = 0
        for job in batch:
            _settle(job, results=list(results[start : start + len(job.texts)]))
            start += len(job.texts)

    async def _call(self, batch: list[_Job]) -> Sequence[Any]:
        texts = [t for job in batch for t in job.texts]
        prompts = [p for job in batch for p in job.prompts]
        token_scores = any(job.token_scores for job in batch)
        self.calls += 1
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        results = await loop.run_in_executor(self._executor, self.detect, texts, prompts, token_scores)
        if len(results) != len(texts):
            raise RuntimeError(f"detect returned {len(results)} results for {len(texts)} texts")
        log.debug("scored %d texts from %d requests in %.3f s", len(texts), len(batch), time.perf_counter() - start)
        return results


def _settle(job: _Job, results: list[Any] | None = None, error: BaseException | None = None) -> None:
    if job.future.done():  # cancelled while it was being scored
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(results)
