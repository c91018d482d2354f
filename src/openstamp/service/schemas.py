"""Request and response bodies of the HTTP API (they make FastAPI's OpenAPI spec).

A result item is ``DetectionResult.to_dict()`` plus the text's index in the request.
"""

from __future__ import annotations

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


class DetectRequest(BaseModel):
    """A batch of texts to score, with optional prompts that condition the scores."""

    model_config = ConfigDict(extra="forbid")

    texts: list[StrictStr] = Field(description="texts to score; an empty or short text gives status too_short")
    prompts: list[StrictStr | None] | None = Field(
        default=None, description="one prompt (or null) per text; prompts are never scored"
    )
    token_scores: StrictBool = Field(default=False, description="include per-token LLR scores and tokens")

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
        if self.prompts is not None and len(self.prompts) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(self.prompts)} prompts")
        return self


class DetectItem(BaseModel):
    """One text's detection: the library's DetectionResult, plus its index in the request."""

    index: int = Field(description="position of the text in the request")
    status: str = Field(description="ok, or too_short (fewer scored tokens than the minimum; no score)")
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


class DetectResponse(BaseModel):
    key_id: str = Field(description="public identifier of the key the texts were scored against")
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
    key_id: str
    detectors: list[str] = Field(description="scores in each result's `detectors`")
    decision: DecisionInfo
    calibrated_fprs: list[str] = Field(description="false-positive rates the key has calibrated thresholds for")
    limits: dict[str, int]
    batching: dict[str, int | float]


class HealthResponse(BaseModel):
    status: str
    queued: int


class ErrorResponse(BaseModel):
    detail: str | list[dict] = Field(description="what was wrong with the request")
