"""How real a paraphrase is: meaning kept (sentence-embedding cosine) and wording changed (3-gram survival).

A paraphrase that keeps most of its input's 3-grams is a near-copy and no attack; one with a
low cosine similarity has changed what the text says. Both are reported next to detection.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from openstamp.embed.sentences import encode_texts
from openstamp.lab.attacks.report import new_figure, save_figure
from openstamp.model.text import encode


def ngram_survival(original: Sequence, paraphrase: Sequence, n: int = 3) -> float:
    """Fraction of the original's distinct n-grams that also occur in the paraphrase (nan if it has none)."""
    grams = _grams(original, n)
    return len(grams & _grams(paraphrase, n)) / len(grams) if grams else float("nan")


def _grams(seq: Sequence, n: int) -> set[tuple]:
    return {tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)}


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def measure_quality(
    originals: list[str],
    paraphrases: list[str],
    tokenizer: PreTrainedTokenizerBase,
    embedder: str = "minilm",
    near_copy: float = 0.8,
) -> dict:
    """Per-sample similarity, 3-gram survival and length ratio, and their summary."""
    a = encode_texts(originals, embedder, progress=False)
    b = encode_texts(paraphrases, embedder, progress=False)
    cosine = (a * b).sum(-1).tolist()
    orig_ids, para_ids = encode(tokenizer, originals), encode(tokenizer, paraphrases)
    tokens = [ngram_survival(o, p) for o, p in zip(orig_ids, para_ids, strict=True)]
    word3 = [ngram_survival(words(o), words(p)) for o, p in zip(originals, paraphrases, strict=True)]
    ratio = [len(p) / max(len(o), 1) for o, p in zip(orig_ids, para_ids, strict=True)]
    return {
        "cosine": cosine,
        "token_3gram_survival": tokens,
        "word_3gram_survival": word3,
        "length_ratio": ratio,
        "summary": {
            "n": len(originals),
            "cosine_mean": float(np.mean(cosine)),
            "token_3gram_survival_mean": float(np.nanmean(tokens)),
            "word_3gram_survival_mean": float(np.nanmean(word3)),
            "near_copy_fraction": float(np.mean([t >= near_copy for t in tokens])),
            "empty_fraction": float(np.mean([not p.strip() for p in paraphrases])),
            "length_ratio_mean": float(np.mean(ratio)),
        },
    }


def similarity_plot(quality: dict, path: Path) -> Path:
    fig, ax = new_figure(5.5, 3.8)
    values = [c for q in quality.values() for c in q["cosine"]]
    ax.hist(values, bins=30, range=(min(0.0, min(values, default=0.0)), 1.0), color="tab:blue", alpha=0.8)
    if values:
        ax.axvline(float(np.mean(values)), color="k", ls="--", lw=1, label=f"mean {np.mean(values):.2f}")
        ax.legend(fontsize=8)
    ax.set(xlabel="cosine similarity (original, paraphrase)", ylabel="paraphrases", title="paraphrase similarity")
    return save_figure(fig, path)
