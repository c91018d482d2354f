"""Choose the strength: the smallest delta whose watermark is detected as often as the owner asks.

A model owner states what detection must buy (``target_tpr`` of texts of ``tokens`` new tokens
flagged at p <= ``fpr``, prompts withheld from the detector) and pays for it in the model's own
perplexity on human text. With the key built once, the detection rate rises with delta (over
the useful range), so

    delta* = min { delta : TPR(delta) >= target_tpr }

is found in two passes. An ascending pass doubles delta from ``low`` until a probe reaches the
target (or ``high`` is passed); a bisection on log(delta) between the last probe that missed and
the first that reached it then narrows the answer in ``steps`` probes. Ascending first matters:
far above the useful range a re-tied model's text degenerates and detection can fall again,
so TPR is not monotone in delta there. Each probe watermarks the model at that delta, samples
one completion per held-out prompt, and detects them with their calibrated p-values. Every
probe's TPR (with a 95% Clopper-Pearson interval) and its own perplexity on the prompts' human
continuations are kept, so the report shows the trade-off the search walked through.

``target="pooled"`` asks the same of sources instead of texts: a source is ``texts`` completions
drawn at random from the probe's ``n``, detected together (``detect/pool.py``), and it counts as
detected at pooled p <= ``p``; TPR is then the fraction of ``sources`` random sources detected.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import DetectConfig, check, option
from openstamp.corpus import Document
from openstamp.detect.detector import Detector
from openstamp.detect.pool import source_pvalues
from openstamp.detect.rates import clopper_pearson
from openstamp.key.key import WatermarkKey
from openstamp.model.generate import sample_completions
from openstamp.model.patch import apply_watermark, revert_watermark
from openstamp.model.perplexity import perplexity, window_nll
from openstamp.model.text import bos_prefix, prompt_windows

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    target_tpr: float = option(0.99, "fraction of watermarked texts that must be flagged")
    tokens: int = option(200, "new tokens per text (the length detection must work at)")
    fpr: float = option(0.01, "flag at p-value <= this false-positive rate")
    n: int = option(64, "held-out prompts per probe")
    prompt_tokens: int = option(50, "tokens of each prompt (withheld from the detector)")
    low: float = option(0.25, "smallest delta tried")
    high: float = option(4.0, "largest delta tried")
    steps: int = option(3, "bisection steps after the ascending pass (each probes one delta)")
    batch_size: int = option(16, "completions per generation batch")
    seed: int = option(0, "sampling seed (one seed for every probe)")
    target: str = option(
        "texts", "texts: target_tpr of single texts flagged at p <= fpr; pooled: target_tpr of sources detected"
    )
    texts: int = option(20, "pooled: texts per source (a random group of the probe's n completions)")
    p: float = option(1e-6, "pooled: a source is detected when its pooled p-value is <= this")
    sources: int = option(20, "pooled: random sources per probe")

    def __post_init__(self) -> None:
        check(self.target in ("texts", "pooled"), "target must be texts or pooled")
        check(self.target == "texts" or 1 <= self.texts <= self.n, "pooled: need 1 <= texts <= n")
        check(0 < self.p < 1 and self.sources >= 1, "pooled: need 0 < p < 1 and sources >= 1")
        check(0 < self.target_tpr <= 1 and 0 < self.fpr < 1, "need 0 < target_tpr <= 1 and 0 < fpr < 1")
        check(0 < self.low < self.high, "need 0 < low < high")
        check(min(self.tokens, self.n, self.prompt_tokens, self.batch_size) >= 1 and self.steps >= 0, "sizes >= 1")


def heldout_pairs(tokenizer, documents: list[Document], cfg: TuneConfig) -> list[tuple[list[int], list[int]]]:
    """``n`` (prompt, human continuation) windows; raises if the documents hold fewer."""
    pairs = prompt_windows(tokenizer, [d.text for d in documents], cfg.prompt_tokens, cfg.tokens)
    if len(pairs) < cfg.n:
        raise ValueError(
            f"the held-out documents hold {len(pairs)} windows of {cfg.prompt_tokens}+{cfg.tokens} tokens, "
            f"fewer than n={cfg.n}; lower --n or --tokens, or use a larger corpus"
        )
    return pairs[: cfg.n]


def own_perplexity(model, tokenizer, pairs, batch_size: int) -> float:
    """The model's own perplexity on each pair's human continuation given BOS and its prompt."""

    bos = bos_prefix(tokenizer)
    return perplexity(window_nll(model, [(bos + p, h) for p, h in pairs], batch_size=batch_size))


def probe(model, tokenizer, key: WatermarkKey, pairs, cfg: TuneConfig, tied_head: str, progress: bool) -> dict:
    """Watermark at ``key.delta``, sample, detect, and measure the model's own perplexity; then revert."""

    apply_watermark(model, key, tied_head)
    try:
        ids = sample_completions(
            model, tokenizer, [p for p, _ in pairs], cfg.tokens, seed=cfg.seed, batch_size=cfg.batch_size,
            progress=progress,
        )  # fmt: skip
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        detector = Detector(model, tokenizer, key, DetectConfig(alpha=cfg.fpr))
        if cfg.target == "pooled":  # a source: a random group of cfg.texts completions, detected together
            p_values, level = source_pvalues(detector, texts, cfg.texts, cfg.sources, cfg.seed), cfg.p
        else:
            p_values, level = [r.p_value for r in detector.detect(texts)], cfg.fpr
        own = own_perplexity(model, tokenizer, pairs, cfg.batch_size)
    finally:
        revert_watermark(model, key)
    hits = sum(p is not None and p <= level for p in p_values)
    rate = hits / len(p_values)
    return {"delta": key.delta, "tpr": rate, "tpr_ci": clopper_pearson(hits, len(p_values)), "own_ppl": own}


def tune_delta(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    key: WatermarkKey,
    heldout: list[Document],
    cfg: TuneConfig,
    tied_head: str = "retie",
    progress: bool = True,
) -> tuple[WatermarkKey, dict]:
    """The key at the smallest delta that reaches ``cfg.target_tpr``, and the search's report.

    ``model`` must be the original (unwatermarked) model; it is left as it was. If no probe
    reaches the target, the key at the probe with the highest TPR is returned and ``reached``
    is False.
    """
    pairs = heldout_pairs(tokenizer, heldout, cfg)
    original = own_perplexity(model, tokenizer, pairs, cfg.batch_size)
    probes: list[dict] = []

    def run(delta: float) -> bool:
        variant = dataclasses.replace(key, delta=delta, meta=copy.deepcopy(key.meta))  # probes record their own
        result = probe(model, tokenizer, variant, pairs, cfg, tied_head, progress)
        result["own_ppl_change"] = result["own_ppl"] / original - 1
        probes.append(result)
        log.info("delta %.3g: TPR %.3f, own perplexity %+.1f%%", delta, result["tpr"], 100 * result["own_ppl_change"])
        return result["tpr"] >= cfg.target_tpr

    grid = [cfg.low * 2**i for i in range(int(math.log2(cfg.high / cfg.low)) + 1)]
    grid += [cfg.high] if grid[-1] < cfg.high else []
    missed, chosen = None, None
    for delta in grid:
        if run(delta):
            chosen = delta
            break
        missed = delta
    reached = chosen is not None
    if reached and missed is not None:
        lo, hi = math.log(missed), math.log(chosen)
        for _ in range(cfg.steps):
            mid = (lo + hi) / 2
            if run(math.exp(mid)):
                hi, chosen = mid, probes[-1]["delta"]
            else:
                lo = mid
    if not reached:  # the best the grid found: highest TPR, then the smaller delta
        chosen = max(probes, key=lambda p: (p["tpr"], -p["delta"]))["delta"]
    best = next(p for p in probes if p["delta"] == chosen)
    report = {
        "settings": dataclasses.asdict(cfg),
        "reached": reached,
        "delta": chosen,
        "tpr": best["tpr"],
        "tpr_ci": best["tpr_ci"],
        "own_ppl": best["own_ppl"],
        "own_ppl_original": original,
        "own_ppl_change": best["own_ppl_change"],
        "probes": sorted(probes, key=lambda p: p["delta"]),
    }
    return dataclasses.replace(key, delta=chosen, meta={**copy.deepcopy(key.meta), "tune": report}), report
