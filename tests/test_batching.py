"""The micro-batcher on its own, with a fake detection function (no model)."""

import asyncio
import threading
import time

import pytest

from openstamp.service.batching import MicroBatcher, QueueFull, ServiceClosing


class FakeDetect:
    """Records each call's texts; 'boom' raises; an unset gate blocks the call."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[list[str]] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, texts, prompts, token_scores):
        self.gate.wait(10)
        time.sleep(self.delay)
        self.calls.append(list(texts))
        if "boom" in texts:
            raise ValueError("cannot score boom")
        return [f"{t}|{p}|{token_scores}" for t, p in zip(texts, prompts, strict=True)]


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_calls_and_get_their_own_results():
    fake = FakeDetect()

    async def main():
        batcher = MicroBatcher(fake, max_batch=4, max_wait_ms=50, max_queue=100)
        await batcher.start()
        jobs = [batcher.submit([f"t{i}"], [None], False) for i in range(10)]
        results = await asyncio.gather(*jobs)
        await batcher.close()
        return results

    results = run(main())
    assert results == [[f"t{i}|None|False"] for i in range(10)]
    assert [len(c) for c in fake.calls] == [4, 4, 2]


def test_a_large_request_runs_alone_and_token_scores_are_shared():
    fake = FakeDetect()

    async def main():
        batcher = MicroBatcher(fake, max_batch=2, max_wait_ms=0, max_queue=10)
        await batcher.start()
        results = await asyncio.gather(
            batcher.submit(["a", "b", "c"], ["p", None, None], True), batcher.submit(["d"], [None], False)
        )
        await batcher.close()
        return results

    big, small = run(main())
    assert big == ["a|p|True", "b|None|True", "c|None|True"] and small == ["d|None|False"]
    assert fake.calls == [["a", "b", "c"], ["d"]]


def test_one_failing_request_does_not_fail_the_others():
    fake = FakeDetect()

    async def main():
        batcher = MicroBatcher(fake, max_batch=8, max_wait_ms=20, max_queue=10)
        await batcher.start()
        results = await asyncio.gather(
            batcher.submit(["a"], [None], False),
            batcher.submit(["boom"], [None], False),
            batcher.submit(["b"], [None], False),
            return_exceptions=True,
        )
        await batcher.close()
        return results

    a, boom, b = run(main())
    assert a == ["a|None|False"] and b == ["b|None|False"]
    assert isinstance(boom, ValueError) and "boom" in str(boom)
    assert fake.calls[0] == ["a", "boom", "b"]  # tried together first, then one by one


def test_a_full_queue_refuses_instead_of_growing():
    fake = FakeDetect()
    fake.gate.clear()

    async def main():
        batcher = MicroBatcher(fake, max_batch=1, max_wait_ms=0, max_queue=2)
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(["1"], [None], False))
        while batcher.calls == 0:  # the worker holds the first request
            await asyncio.sleep(0.001)
        waiting = [asyncio.ensure_future(batcher.submit([t], [None], False)) for t in "23"]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull):
            await batcher.submit(["4"], [None], False)
        fake.gate.set()
        done = await asyncio.gather(first, *waiting)
        await batcher.close()
        return done

    assert run(main()) == [["1|None|False"], ["2|None|False"], ["3|None|False"]]


def test_close_finishes_accepted_requests_and_refuses_new_ones():
    fake = FakeDetect(delay=0.02)

    async def main():
        batcher = MicroBatcher(fake, max_batch=1, max_wait_ms=0, max_queue=10)
        await batcher.start()
        accepted = [asyncio.ensure_future(batcher.submit([str(i)], [None], False)) for i in range(5)]
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(batcher.close())
        await asyncio.sleep(0)
        with pytest.raises(ServiceClosing):
            await batcher.submit(["late"], [None], False)
        await closing
        return [f.result() for f in accepted]

    assert run(main()) == [[f"{i}|None|False"] for i in range(5)]
    assert len(fake.calls) == 5


def test_abandoned_requests_are_not_scored():
    fake = FakeDetect()
    fake.gate.clear()

    async def main():
        batcher = MicroBatcher(fake, max_batch=1, max_wait_ms=0, max_queue=10)
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(["kept"], [None], False))
        while batcher.calls == 0:
            await asyncio.sleep(0.001)
        gone = asyncio.ensure_future(batcher.submit(["gone"], [None], False))
        await asyncio.sleep(0.01)
        gone.cancel()  # the client disconnected while waiting
        fake.gate.set()
        await first
        await batcher.close()

    run(main())
    assert fake.calls == [["kept"]]
