"""A Python client for the detection service.

    from openstamp.client import DetectionClient

    with DetectionClient("http://127.0.0.1:8080", token) as client:
        results = client.detect(["some text", "another"])   # list[DetectionResult]
        chats = client.detect_messages([[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "..."}]])
        pooled = client.detect_pool(["one text", "another", "a third"])  # one DetectionResult, n_texts 3

Requests are split to fit the server's limits, and retried with exponential backoff
(honouring Retry-After) when the server is busy (429), shutting down (503) or unreachable
for a moment. The results are the same objects local detection returns.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import fields
from typing import Any

import httpx

from openstamp.detect.result import DetectionResult

TOKEN_ENV = "OPENSTAMP_API_TOKEN"
RETRY_STATUS = frozenset({429, 502, 503, 504})
RESULT_FIELDS = frozenset(f.name for f in fields(DetectionResult))


class ServiceError(ValueError):
    """The service refused a request or could not be reached. ``status`` is the HTTP code, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DetectionClient:
    """Talk to ``openstamp serve``.

    Args:
        url: the service's base URL, e.g. ``http://127.0.0.1:8080``.
        token: an API key (default ``$OPENSTAMP_API_TOKEN``); None for a ``--no-auth`` service.
        timeout: seconds to wait for one response.
        retries: further attempts after a 429, 503 or connection failure.
        backoff: seconds before the first retry; doubled each time (with jitter, at most 30 s).
        http: an ``httpx.Client`` to use instead of a new one (tests pass a mock transport).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 300.0,
        retries: int = 6,
        backoff: float = 0.5,
        http: httpx.Client | None = None,
    ) -> None:
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retries, self.backoff = retries, backoff
        self.http = http or httpx.Client(timeout=timeout)
        self.http.headers.update(headers)
        self.key_id: str | None = None  # the key of the last response (None when the service holds several)
        self.key_ids: list[str] | None = None
        self._limits: dict[str, int] | None = None

    def __enter__(self) -> DetectionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # -- API -----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz")

    def info(self) -> dict[str, Any]:
        """Model name, key id, detectors, decision rule and limits of the service."""
        return self._request("GET", "/v1/info")

    def detect(
        self,
        texts: list[str],
        prompts: list[str | None] | None = None,
        *,
        token_scores: bool = False,
    ) -> list[DetectionResult]:
        """Score each text (with its optional prompt); one DetectionResult per text, in order."""
        if isinstance(texts, str):
            raise TypeError("detect() takes a list of texts; wrap a single text in a list")
        prompts = list(prompts) if prompts is not None else [None] * len(texts)
        if len(prompts) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(prompts)} prompts")

        def body(idx: range) -> dict[str, Any]:
            data: dict[str, Any] = {"texts": [texts[i] for i in idx], "token_scores": token_scores}
            if any(prompts[i] is not None for i in idx):
                data["prompts"] = [prompts[i] for i in idx]
            return data

        return self._chunks(len(texts), body)

    def detect_messages(
        self,
        conversations: list[list[dict]],
        *,
        drop_system: bool = False,
        drop_reasoning: bool = False,
        token_scores: bool = False,
    ) -> list[DetectionResult]:
        """Score the assistant turns of each conversation ({role, content} messages); one result each."""
        options = {"drop_system": drop_system, "drop_reasoning": drop_reasoning, "token_scores": token_scores}
        return self._chunks(len(conversations), lambda idx: {"messages": [conversations[i] for i in idx], **options})

    def detect_pool(
        self, texts: list[str], prompts: list[str | None] | None = None, *, dedupe: bool = False
    ) -> DetectionResult:
        """One pooled result for the whole set (``Detector.detect_pool`` on the server), with ``n_texts``.

        The set goes in one request: its p-value is one test over all of its tokens, which no split into
        several requests could give. A set above the server's limits is refused with what to do instead.
        """
        if isinstance(texts, str):
            raise TypeError("detect_pool() takes a list of texts; wrap a single text in a list")
        prompts = list(prompts) if prompts is not None else [None] * len(texts)
        if len(prompts) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(prompts)} prompts")
        if self._limits is None:
            self._limits = self.info()["limits"]
        too_big = "a pool is scored in one request, so raise the server's limits or detect it locally (--model/--key)"
        if len(texts) > self._limits.get("max_texts", len(texts)):
            raise ServiceError(
                f"a pool of {len(texts)} texts is more than this service takes in one request "
                f"(max_texts {self._limits['max_texts']}); {too_big}",
                413,
            )
        body: dict[str, Any] = {"texts": list(texts), "pool": True, "dedupe": dedupe}
        if any(p is not None for p in prompts):
            body["prompts"] = prompts
        try:
            data = self._request("POST", "/v1/detect", json=body)
        except ServiceError as err:
            if err.status != 413:
                raise
            raise ServiceError(f"{err}; {too_big}", 413) from None
        return self._results(data, 1)[0]

    # -- plumbing ------------------------------------------------------------------------------

    def _chunks(self, n: int, body) -> list[DetectionResult]:
        """Results of ``n`` items in requests of at most the server's ``max_texts`` (``body``: range -> JSON)."""
        if self._limits is None:
            self._limits = self.info()["limits"]
        step = max(1, self._limits.get("max_texts", n or 1))
        results: list[DetectionResult] = []
        for start in range(0, n, step):
            results += self._detect(range(start, min(start + step, n)), body)
        return results

    def _detect(self, idx: range, body) -> list[DetectionResult]:
        """One request; split in halves when the server finds it too large (413)."""
        try:
            data = self._request("POST", "/v1/detect", json=body(idx))
        except ServiceError as err:
            if err.status != 413 or len(idx) < 2:
                raise
            half = len(idx) // 2
            return self._detect(idx[:half], body) + self._detect(idx[half:], body)
        return self._results(data, len(idx))

    def _results(self, data: dict[str, Any], n: int) -> list[DetectionResult]:
        """The ``n`` results of a /v1/detect response, in order; notes the key ids it was scored against."""
        self.key_id = data.get("key_id")
        self.key_ids = data.get("key_ids") or [self.key_id]
        items = sorted(data["results"], key=lambda item: item["index"])
        if [item["index"] for item in items] != list(range(n)):
            raise ServiceError(f"the server returned {len(items)} results where {n} were due")
        return [DetectionResult(**{k: v for k, v in item.items() if k in RESULT_FIELDS}) for item in items]

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self.http.request(method, self.url + path, **kwargs)
            except (httpx.ConnectError, httpx.RemoteProtocolError) as err:
                if last:
                    raise ServiceError(f"cannot reach the detection service at {self.url}: {err}") from None
                self._sleep(attempt, None)
                continue
            except httpx.HTTPError as err:
                raise ServiceError(f"request to {self.url}{path} failed: {err}") from None
            if response.status_code in RETRY_STATUS and not last:
                self._sleep(attempt, response.headers.get("retry-after"))
                continue
            if response.is_success:
                return response.json()
            raise ServiceError(_describe(response), response.status_code)
        raise AssertionError("unreachable")

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        wait = min(30.0, self.backoff * 2**attempt) * (0.5 + random.random() / 2)
        if retry_after is not None:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:
                pass
        time.sleep(wait)


def _describe(response: httpx.Response) -> str:
    """One line from an error response: the server's ``detail`` when it sent one."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = response.text[:200]
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    return f"the detection service answered {response.status_code}: {detail}"
