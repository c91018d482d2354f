"""Limits and batching of the detection service: a frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from openstamp.config import check, option


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """What one request may ask for, and how requests share forward passes."""

    max_texts: int = option(64, "texts per request; more gives 413")
    max_chars: int = option(20_000, "characters per text or prompt; more gives 413")
    max_request_tokens: int = option(65_536, "tokens (texts and prompts) per request; more gives 413")
    max_body_bytes: int = option(4 * 2**20, "request body size in bytes; more gives 413")
    max_batch: int = option(32, "texts per shared detection call (micro-batch)")
    max_wait_ms: float = option(10.0, "how long the first queued request waits for others to join its batch")
    max_queue: int = option(
        64, "requests waiting for a batch; more gives 429 with Retry-After (memory <= max_queue x body size)"
    )
    retry_after_s: int = option(1, "the Retry-After a client gets with 429 or 503")
    log_texts: bool = option(False, "log the start of each text (off: only counts and timings are logged)")
    allow_token_scores: bool = option(
        False, "serve per-token scores; they show a caller the watermark logit of every token (off: 403)"
    )
    verify_roots: tuple[str, ...] = option(
        (), "directories whose checkpoints POST /v1/verify-model may read (none: 403)"
    )
    verify_base: str | None = option(None, "the original model (directory) /v1/verify-model compares against")

    def __post_init__(self) -> None:
        for name in (
            "max_texts",
            "max_chars",
            "max_request_tokens",
            "max_body_bytes",
            "max_batch",
            "max_queue",
        ):
            check(getattr(self, name) >= 1, f"{name} must be >= 1")
        check(self.max_wait_ms >= 0, "max_wait_ms must be >= 0")
        check(self.retry_after_s >= 0, "retry_after_s must be >= 0")

    def limits(self) -> dict[str, int]:
        """The limits a client needs to know (shown by GET /v1/info)."""
        data = asdict(self)
        return {k: data[k] for k in ("max_texts", "max_chars", "max_request_tokens", "max_body_bytes")}
