"""The detection service: a thin FastAPI layer over ``Detector.detect``.

    POST /v1/detect   texts (and prompts), or conversations -> DetectionResult records, micro-batched
    POST /v1/verify-model  a checkpoint under the server's verify roots -> the weights test (service/verify.py)
    GET  /v1/info     model, key ids, detectors, decision rule, limits; no key material
    GET  /healthz     liveness (no authentication)
    GET  /            the detection page and its static files (no authentication)

All scoring is the library's; the service adds authentication, limits and batching.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer

from openstamp import __version__
from openstamp.detect.chat import Chat
from openstamp.detect.detector import Detector
from openstamp.detect.multikey import MultiKeyDetector
from openstamp.service.auth import ApiKeys
from openstamp.service.batching import MicroBatcher, QueueFull, ServiceClosing
from openstamp.service.config import ServiceConfig
from openstamp.service.guard import Guard
from openstamp.service.page import router as page_router
from openstamp.service.schemas import (
    DecisionInfo,
    DetectItem,
    DetectRequest,
    DetectResponse,
    ErrorResponse,
    HealthResponse,
    InfoResponse,
)
from openstamp.service.verify import add_verify_route

log = logging.getLogger(__name__)

ERRORS = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "the body is not UTF-8, or a text could not be scored",
        401: "missing or wrong API key",
        403: "per-token scores were asked for but the server does not serve them",
        413: "too many texts, characters or tokens, or too large a body",
        422: "malformed JSON, or fields of the wrong type",
        429: "too many requests waiting; retry after Retry-After seconds",
        503: "the service is shutting down",
    }.items()
}
# Documents the bearer scheme in the OpenAPI spec; the Guard middleware does the checking.
bearer = HTTPBearer(auto_error=False, description="an API key given to `openstamp serve --api-keys`")


def create_app(
    detector: Detector | MultiKeyDetector,
    config: ServiceConfig | None = None,
    keys: ApiKeys | None = None,
    *,
    model_name: str | None = None,
) -> FastAPI:
    """The ASGI app serving ``detector`` (one key, or several). ``keys=None`` means anonymous access."""
    config = config or ServiceConfig()
    tokenizer = copy.deepcopy(detector.tokenizer)  # token counting runs beside detection: its own copy
    batcher = MicroBatcher(
        lambda texts, prompts, scores: [r.to_dict() for r in detector.detect(texts, prompts, token_scores=scores)],
        max_batch=config.max_batch,
        max_wait_ms=config.max_wait_ms,
        max_queue=config.max_queue,
    )
    info = service_info(detector, config, model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.counter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openstamp-count")
        await batcher.start()
        log.info("serving key(s) %s with %s", ", ".join(info.key_ids), info.model)
        yield
        await batcher.close()  # uvicorn has already finished the open requests
        app.state.counter.shutdown(wait=True)
        app.state.counter = None

    app = FastAPI(
        title="OpenStamp detection",
        version=__version__,
        description="Score texts for the OpenStamp watermark of one model with a private key.",
        lifespan=lifespan,
    )
    app.add_middleware(Guard, keys=keys, max_body_bytes=config.max_body_bytes)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.state.batcher = batcher
    app.include_router(page_router)  # GET /: the detection page (public; its requests carry the key)

    @app.get("/healthz", response_model=HealthResponse)
    async def healthz() -> HealthResponse:
        return HealthResponse(status="ok", queued=batcher.queued)

    @app.get("/v1/info", response_model=InfoResponse, dependencies=[Security(bearer)], responses=ERRORS)
    async def v1_info() -> InfoResponse:
        return info

    @app.post(
        "/v1/detect",
        response_model=DetectResponse,
        response_model_exclude_unset=True,
        dependencies=[Security(bearer)],
        responses=ERRORS,
    )
    async def v1_detect(body: DetectRequest) -> DetectResponse:
        """Score a batch of texts or conversations; each gets its own status (``ok`` or ``too_short``)."""
        if body.token_scores and not config.allow_token_scores:
            raise HTTPException(403, "this server does not serve per-token scores (--allow-token-scores)")
        texts, pieces = request_texts(body)
        prompts = body.prompts or [None] * len(texts)
        retry = {"Retry-After": str(config.retry_after_s)}
        counter = getattr(app.state, "counter", None)
        if counter is None:
            raise HTTPException(503, "the service is not running; retry later", headers=retry)
        loop = asyncio.get_running_loop()
        n_tokens = await loop.run_in_executor(counter, check_size, tokenizer, config, pieces, prompts, len(texts))
        if config.log_texts:
            for i, text in enumerate(pieces):
                log.info("text %d: %r", i, text[:80])
        try:
            if body.pool:  # one result for the set, scored alone between batches
                pool = partial(detector.detect_pool, dedupe=body.dedupe)
                records = [(await batcher.call(pool, texts, prompts)).to_dict()]
            else:
                records = await batcher.submit(texts, prompts, body.token_scores)
        except QueueFull as err:
            raise HTTPException(429, f"the service is busy ({err}); retry later", headers=retry) from None
        except ServiceClosing:
            raise HTTPException(503, "the service is shutting down; retry later", headers=retry) from None
        except (ValueError, TypeError) as err:
            raise HTTPException(400, f"could not score this request: {err}") from None
        log.debug("scored %d texts (%d tokens)", len(records), n_tokens)
        items = []
        for i, record in enumerate(records):
            if not body.token_scores:
                record.pop("token_scores", None)
                record.pop("tokens", None)
            items.append(DetectItem(index=i, **record))
        key_ids = detector.key_ids
        return DetectResponse(key_id=key_ids[0] if len(key_ids) == 1 else None, key_ids=key_ids, results=items)

    add_verify_route(app, detector, config, bearer, ERRORS)  # POST /v1/verify-model (service/verify.py)
    return app


def request_texts(body: DetectRequest) -> tuple[list, list[str]]:
    """What to score (texts, or a Chat per conversation) and the strings the limits apply to."""
    if body.messages is None:
        return list(body.texts or []), list(body.texts or [])
    options = {"drop_system": body.drop_system, "drop_reasoning": body.drop_reasoning}
    chats = [Chat([m.model_dump() for m in conv], **options) for conv in body.messages]
    return chats, [m.content for conv in body.messages for m in conv]


def check_size(tokenizer, config: ServiceConfig, texts: list[str], prompts: list[str | None], n_items: int) -> int:
    """Raise 413 when a request exceeds the text, character or token limits; else its token count.

    ``texts`` are the request's strings (a conversation's message contents), ``n_items`` its texts or
    conversations."""
    if n_items > config.max_texts:
        raise HTTPException(413, f"{n_items} texts in one request; the limit is {config.max_texts}")
    pieces = [s for s in (*texts, *prompts) if s]
    for s in pieces:
        if len(s) > config.max_chars:
            raise HTTPException(413, f"a text or prompt has {len(s)} characters; the limit is {config.max_chars}")
    n_tokens = sum(map(len, tokenizer(pieces, add_special_tokens=False).input_ids)) if pieces else 0
    if n_tokens > config.max_request_tokens:
        raise HTTPException(
            413, f"the request has {n_tokens} tokens; the limit is {config.max_request_tokens} per request"
        )
    return n_tokens


async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with one clear message per problem, without echoing the submitted texts."""
    detail = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "json_invalid":
            reason = error.get("ctx", {}).get("error", "")
            message = f"the body is not valid JSON: {reason} (at character {loc[-1] if loc else '?'})"
        detail.append({"loc": loc, "msg": message, "type": str(error.get("type", ""))})
    return JSONResponse({"detail": detail}, status_code=422)


def service_info(detector: Detector | MultiKeyDetector, config: ServiceConfig, model_name: str | None) -> InfoResponse:
    """Public facts about the service. Runs one warm-up detection to list the detectors."""
    cfg, key = detector.config, detector.key
    if cfg.threshold is not None:
        method = "fixed LLR threshold"
    elif cfg.calibrated:
        method = "calibrated LLR threshold"
    else:
        method = "permutation p-value" if cfg.p_values else "none (scores only)"
    warmup = [(7 * i + 3) % key.vocab_size for i in range(cfg.min_tokens + 1)]
    result = detector.detect([warmup])[0]
    thresholds = (key.meta.get("calibration") or {}).get("llr_thresholds", {})
    name = model_name or key.meta.get("model", {}).get("source", "unknown")
    return InfoResponse(
        version=__version__,
        model="/".join(Path(str(name)).parts[-2:]),  # not the full local path
        key_id=key.key_id if len(detector.key_ids) == 1 else None,
        key_ids=detector.key_ids,
        detectors=sorted(result.detectors),
        decision=DecisionInfo(
            method=method,
            alpha=cfg.alpha,
            min_tokens=cfg.min_tokens,
            max_tokens=cfg.max_tokens,
            permutations=cfg.n_permutations if cfg.p_values else None,
        ),
        calibrated_fprs=sorted((a for a, tau in thresholds.items() if tau is not None), key=float),
        warnings=detector.calibration_warnings,
        limits=config.limits(),
        batching={"max_batch": config.max_batch, "max_wait_ms": config.max_wait_ms},
    )
