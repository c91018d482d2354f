"""Per-token evidence as HTML: each token shaded by its LLR (green: favoured by the watermark)."""

from __future__ import annotations

import html

from openstamp.detect.result import DetectionResult

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; color: #222; }
.text { line-height: 1.9; white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.9rem;
        border: 1px solid #ddd; padding: 0.8rem; border-radius: 6px; }
.meta { color: #555; font-size: 0.9rem; margin: 1.5rem 0 0.4rem; }
.flag { font-weight: bold; }
.legend span { padding: 0 0.4rem; }
"""


def token_color(score: float, scale: float = 2.0) -> str:
    """rgba background: red for negative, green for positive, opacity by |score| / scale."""
    alpha = min(abs(score) / scale, 1.0) * 0.8
    rgb = "40, 160, 60" if score > 0 else "220, 50, 50"
    return f"rgba({rgb}, {alpha:.3f})"


def render(results: list[DetectionResult], titles: list[str] | None = None, key_id: str = "") -> str:
    """One HTML page with every text's tokens shaded by their per-token LLR."""
    titles = titles or [f"text {i + 1}" for i in range(len(results))]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>OpenStamp evidence</title>",
        f"<style>{_STYLE}</style></head><body><h1>OpenStamp per-token evidence</h1>",
        f"<p>key {html.escape(key_id)}. Each token is shaded by its log-likelihood ratio "
        "log p<sub>wm</sub> / p<sub>orig</sub>: ",
        f"<span class='legend'><span style='background:{token_color(2)}'>favoured by the watermark</span>"
        f"<span style='background:{token_color(-2)}'>disfavoured</span></span></p>",
    ]
    for title, result in zip(titles, results, strict=True):
        parts.append(f"<div class='meta'><b>{html.escape(title)}</b> &mdash; {_summary(result)}</div>")
        if result.tokens is None or result.token_scores is None:
            parts.append("<div class='text'><i>no per-token scores (text too short)</i></div>")
            continue
        spans = (
            f"<span title='{score:+.3f}' style='background:{token_color(score)}'>{html.escape(piece)}</span>"
            for piece, score in zip(result.tokens, result.token_scores, strict=True)
        )
        parts.append(f"<div class='text'>{''.join(spans)}</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _summary(result: DetectionResult) -> str:
    if result.status != "ok":
        return f"{html.escape(result.status)} ({result.n_tokens} tokens)"
    flag = "watermarked" if result.decision else "not flagged"
    p = "" if result.p_value is None else f", p = {result.p_value:.3g}"
    band = "" if result.length_band is None else f" (length band {html.escape(result.length_band)})"
    best = "" if result.best_key is None else f", best key {html.escape(result.best_key)}"
    return (
        f"<span class='flag'>{flag}</span> ({html.escape(result.rule or '')}): mean LLR "
        f"{result.score:+.3f}{p}, {result.n_tokens} tokens{band}{best}"
    )
