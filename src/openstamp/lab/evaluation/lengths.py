"""Detection against length: each run's detector on its completions cut to 16, 32, 64, ... tokens.

A model owner asks how much text a detector needs. For each length L in ``EvalConfig.lengths``
below ``new_tokens`` (the eval's own scores are the full length), the first L + 1 token ids of
every watermarked completion and of every human continuation are decoded and scored, as the
full texts are, so the negatives have the same length as the positives. L counts scored tokens:
a detector scores every token but the first, which has no context (so the full-length row
scores ``new_tokens`` - 1). Per run and length:

* ``tpr_at_1pct_fpr``: TPR with the threshold at 1% FPR of the human texts of that length
  (resolution-limited below 100 negatives, as everywhere);
* ``flagged_at_p_0.01``: the fraction of watermarked texts whose p-value is <= 0.01 (a text the
  detector refuses as too short is not flagged), for methods that give p-values (None otherwise),
  and ``human_flagged_at_p_0.01``, its false-positive rate;
* ``auroc`` against the human texts, and ``scored_tokens``: the median tokens the detector scored;
* ``human_over_full_threshold``: the fraction of human texts of that length above the threshold at 1% FPR of
  the full-length human texts, the false-positive rate a threshold calibrated on full-length text has on
  shorter text (1% if length did not matter; a text that is attacked shorter, a paraphrase, meets it).

Scored inside the eval's hidden-state cache, right after the full texts, a cut text takes the
decoder states of the full text it was cut from (``openstamp.lab.hidden.HiddenCache``): detectors that
run the decoder run it once per text, whatever the number of lengths.

The curve decides only p <= 0.01 (``LEVEL``), so OpenStamp's detector scores the cut texts without its tail
bound (``openstamp.lab.detector.p_values_down_to``: it refines only p-values below the permutation test's
floor of 1/(K + 1) = 0.001, which decide p <= 0.01 alike), as the full texts are scored, and takes the
per-token statistics of a cut text from the full text's (``openstamp.lab.evaluation.memo``): its length curve runs
neither the decoder nor the vocabulary pass again.

The scores are cached in ``scores/lengths/<run>.json``, one file per run; each length records the
ids it cut (``ids``), and a length cached with another cut is scored again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from openstamp.lab.detector import p_values_down_to
from openstamp.lab.evaluation.metrics import auroc, threshold_at_fpr, tpr_at_fpr
from openstamp.lab.methods.base import score_dicts
from openstamp.storage import atomic_write_json, read_json

LEVEL = 0.01  # the p-value level the eval decides at (flagged_at_p_0.01), in its scores and its length curve


def run_lengths(lengths: tuple[int, ...], new_tokens: int) -> list[int]:
    """The lengths shorter than a completion, ascending (the full completion is scored by the eval itself)."""
    return sorted({n for n in lengths if 0 < n < new_tokens})


def lengths_path(out: Path, run: str) -> Path:
    return out / "scores" / "lengths" / f"{run.replace('/', '_')}.json"


def score_lengths(out: Path, run: str, method, model, tokenizer, watermarked, human, lengths, batch, memo=None) -> None:
    """Score the first L + 1 ids of the watermarked and human token lists for every L; cached per run and length
    (``memo``: see ``openstamp.lab.methods.base.score_dicts``)."""
    path = lengths_path(out, run)
    scores = read_json(path, "length scores") if path.exists() else {}
    todo = [n for n in lengths if scores.get(str(n), {}).get("ids") != n + 1]
    if not todo:
        return
    for n in todo:
        entry = {"ids": n + 1}
        for name, ids in (("watermarked", watermarked), ("human", human)):
            texts = tokenizer.batch_decode([x[: n + 1] for x in ids], skip_special_tokens=True)
            with p_values_down_to(LEVEL):
                entry[name] = score_dicts(method, model, tokenizer, texts, batch, memo)
        scores[str(n)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, scores)


def curve(scores: dict) -> list[dict]:
    """One row per length: TPR@1%FPR, AUROC, the p <= 0.01 decisions, the full-length threshold's false positives
    and the median scored tokens (the longest length is the full one)."""
    rows, full = [], None
    for n, sets in sorted(scores.items(), key=lambda item: -int(item[0])):
        pos = np.array([-np.inf if r["score"] is None else r["score"] for r in sets["watermarked"]])
        neg = np.array([r["score"] for r in sets["human"] if r["score"] is not None], dtype=np.float64)
        if full is None and len(neg):
            full = threshold_at_fpr(neg, 0.01)
        # a text the detector refused (too short after re-tokenising) is not flagged, as its score is -inf
        p_pos = [1.0 if r["p_value"] is None else r["p_value"] for r in sets["watermarked"]]
        p_neg = [r["p_value"] for r in sets["human"] if r["p_value"] is not None]
        has_p = any(r["p_value"] is not None for r in sets["watermarked"] + sets["human"])
        rows.append(
            {
                "tokens": int(n),
                "scored_tokens": float(np.median([r["n_tokens"] for r in sets["watermarked"]])),
                "auroc": auroc(pos, neg) if len(neg) else None,  # None: no human text of this length was scorable
                "tpr_at_1pct_fpr": tpr_at_fpr(pos, neg, 0.01)["tpr"] if len(neg) else None,
                "flagged_at_p_0.01": float(np.mean(np.array(p_pos) <= LEVEL)) if has_p else None,
                "human_flagged_at_p_0.01": float(np.mean(np.array(p_neg) <= LEVEL)) if has_p and p_neg else None,
                "human_over_full_threshold": float(np.mean(neg > full)) if full is not None and len(neg) else None,
            }
        )
    return rows[::-1]


def run_curve(out: Path, run: str, full: dict, new_tokens: int) -> list[dict] | None:
    """The length curve of a run, its full-length ``full`` scores last; None where no shorter length was scored."""
    path = lengths_path(out, run)
    if not path.exists():
        return None
    scores = read_json(path, "length scores")
    scores[str(new_tokens)] = {k: full[k] for k in ("watermarked", "human")}
    return curve(scores)


def mean_curve(per_run: list[dict]) -> list[dict]:
    """Per (method, strength): the mean over seeds of each length's figures."""
    keys = (
        "tpr_at_1pct_fpr",
        "flagged_at_p_0.01",
        "human_flagged_at_p_0.01",
        "human_over_full_threshold",
        "auroc",
        "scored_tokens",
    )
    rows = []
    for method, strength in dict.fromkeys((r["method"], r["strength"]) for r in per_run if r.get("length_curve")):
        group = [r["length_curve"] for r in per_run if (r["method"], r["strength"]) == (method, strength)]
        for tokens in [row["tokens"] for row in group[0]]:
            at = [row for g in group for row in g if row["tokens"] == tokens]
            means = {}
            for k in keys:
                values = [row[k] for row in at if row[k] is not None]
                means[k] = float(np.mean(values)) if values else None
            rows.append({"method": method, "strength": strength, "tokens": tokens, "seeds": len(at), **means})
    return rows
