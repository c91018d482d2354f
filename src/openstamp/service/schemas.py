"""Request and response bodies of the HTTP API (they make FastAPI's OpenAPI spec).

A result item is ``DetectionResult.to_dict()`` plus the text's index in the request.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator, model_validator


def _unicode(values: list[str | None] | None, what: str) -> list[str | None] | None:
    for i, value in enumerate(values or []):
        if value is None:
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"{what} {i} is not valid Unicode (a lone surrogate at {err.start})") from None
    return values


class Message(BaseModel):
    """One chat message, as for the model's chat template."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: StrictStr

    @field_validator("content")
    @classmethod
    def _content_is_unicode(cls, content: str) -> str:
        return _unicode([content], "message")[0]  # type: ignore[index]


class DetectRequest(BaseModel):
    """A batch of texts (with optional prompts that condition the scores), or of conversations."""

    model_config = ConfigDict(extra="forbid")

    texts: list[StrictStr] | None = Field(
        default=None, description="texts to score; an empty or short text gives status too_short"
    )
    prompts: list[StrictStr | None] | None = Field(
        default=None, description="one prompt (or null) per text; prompts are never scored"
    )
    messages: list[list[Message]] | None = Field(
        default=None,
        description="instead of texts: conversations, rendered with the model's chat template; "
        "only the assistant turns are scored, each with everything before it as context",
    )
    drop_system: StrictBool = Field(default=False, description="messages: leave system messages out of the context")
    drop_reasoning: StrictBool = Field(
        default=False, description="messages: strip <think>...</think> blocks from assistant turns"
    )
    token_scores: StrictBool = Field(default=False, description="include per-token LLR scores and tokens")
    pool: StrictBool = Field(
        default=False,
        description="one pooled result for all the texts (or conversations) together, with n_texts; its p-value "
        "is exact however the texts depend on one another",
    )
    dedupe: StrictBool = Field(
        default=False,
        description="pool: count each repeated (8-token context, token) pair once, for sets whose texts share "
        "boilerplate; which tokens it drops depends on the token ids only, so the p-value stays exact",
    )

    @field_validator("texts")
    @classmethod
    def _texts_are_unicode(cls, texts: list[str]) -> list[str]:
        return _unicode(texts, "text")  # type: ignore[return-value]

    @field_validator("prompts")
    @classmethod
    def _prompts_are_unicode(cls, prompts: list[str | None] | None) -> list[str | None] | None:
        return _unicode(prompts, "prompt")

    @model_validator(mode="after")
    def _one_prompt_per_text(self) -> DetectRequest:
        if (self.texts is None) == (self.messages is None):
            raise ValueError("give either texts or messages")
        if self.pool and self.token_scores:
            raise ValueError("pool gives one result for the set: per-token scores are per text")
        if self.dedupe and not self.pool:
            raise ValueError("dedupe applies to pool: it drops repeats across the set's texts")
        if self.messages is not None:
            if self.prompts is not None:
                raise ValueError("prompts go with texts; a conversation carries its own context")
            if any(not m for m in self.messages):
                raise ValueError("each conversation needs at least one message")
        elif self.prompts is not None and len(self.prompts) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(self.prompts)} prompts")
        elif self.drop_system or self.drop_reasoning:
            raise ValueError("drop_system and drop_reasoning apply to messages")
        return self


class DetectItem(BaseModel):
    """One text's detection: the library's DetectionResult, plus its index in the request."""

    index: int = Field(description="position of the text in the request")
    status: str = Field(
        description="ok, too_short (fewer scored tokens than the minimum; no score) or not_finite (a NaN or infinite "
        "statistic: no score, p-value or decision)"
    )
    n_tokens: int = Field(description="tokens scored (the text only, never the prompt)")
    score: float | None = Field(description="mean per-token LLR")
    p_value: float | None = Field(description="p-value of `test`")
    test: str | None = Field(description="the test behind p_value")
    decision: bool | None = Field(description="true if flagged as watermarked under `rule`")
    rule: str | None = Field(description="what the decision compared")
    detectors: dict[str, int | float | None] = Field(description="every detector's score")
    truncated: bool = Field(description="the input was cut to the service's token limit")
    token_scores: list[float | None] | None = Field(default=None, description="per-token LLR, when asked for")
    tokens: list[str] | None = Field(default=None, description="the scored tokens' text, when asked for")
    length_band: str | None = Field(
        default=None, description="the calibrated length band of the text, when the key has per-length calibration"
    )
    best_key: str | None = Field(default=None, description="several keys: the id of the best-matching key")
    p_values_by_key: dict[str, float | None] | None = Field(
        default=None, description="several keys: each key's Holm-adjusted p-value"
    )
    backbone: str | None = Field(
        default=None, description="which backbone read the text: original (exact p-value) or release (re-tied)"
    )
    n_texts: int | None = Field(default=None, description="pool: the texts in the set (n_tokens: all their tokens)")


class DetectResponse(BaseModel):
    key_id: str | None = Field(description="the key the texts were scored against (null with several; see key_ids)")
    key_ids: list[str] = Field(description="every key the texts were scored against")
    results: list[DetectItem]


class DecisionInfo(BaseModel):
    method: str = Field(description="permutation p-value, calibrated LLR threshold, or fixed LLR threshold")
    alpha: float = Field(description="target false-positive rate of the decision")
    min_tokens: int = Field(description="texts with fewer scored tokens get status too_short")
    max_tokens: int = Field(description="longer inputs are truncated to this many tokens")
    permutations: int | None = Field(description="permutations behind each p-value, if p-values are on")


class InfoResponse(BaseModel):
    """What a client may know: no secret, nothing from which P, S, G or U could be derived."""

    service: str = "openstamp"
    version: str
    model: str = Field(description="name of the served checkpoint")
    key_id: str | None = Field(description="the served key (null when the service holds several; see key_ids)")
    key_ids: list[str] = Field(description="public ids of the served keys; p-values are Holm-adjusted over them")
    detectors: list[str] = Field(description="scores in each result's `detectors`")
    decision: DecisionInfo
    calibrated_fprs: list[str] = Field(description="false-positive rates the key has calibrated thresholds for")
    warnings: list[str] = Field(
        default_factory=list, description="why the calibrated thresholds may not hold their rate, for the operator"
    )
    limits: dict[str, int]
    batching: dict[str, int | float]


class HealthResponse(BaseModel):
    status: str
    queued: int


class ErrorResponse(BaseModel):
    detail: str | list[dict] = Field(description="what was wrong with the request")
