"""Pooled detection: one p-value for a whole set of texts ("this account writes thousands of texts: are they
from my model?").

The pooled statistic is the centred LLR summed over every scored token of every text,

    T = delta * sum_{texts} sum_t s_t . (G[x_t] - m_t) = delta * tr(C),   C = sum_{texts} S^T R   (L x L),

and its null is the same as one text's: the permutation test re-maps the key's list assignment once, for all
tokens of all texts together (T_pi = delta * sum_l C[l, pi(l)]), and the tail bound treats T as one linear
function of the random key (``tail.TailSums``). Neither assumes anything about how the texts relate to one
another: the randomness is the key's, not the texts', so a set that repeats one text 20 times gets a valid
p-value (docs/detection.md, "Pooled detection").

The set is scored batch by batch and only additive sums are kept: C, the LLR sums, the (token, list) pairs of
the binomial count, and the tail bound's (L, V) coefficients; nothing per token. ``dedupe`` counts each
(context window, token) pair once; which tokens it drops depends on the token ids only, never on the key, so
the p-value stays exact.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch
from scipy.stats import binom

from openstamp.config import DetectConfig
from openstamp.detect.items import Item
from openstamp.detect.llr import TokenStats, cross_matrix, cross_pvalue, stats_rows
from openstamp.detect.result import DetectionResult
from openstamp.detect.tail import TailSums, chernoff_pvalue, combined_pvalue

DEDUPE_WINDOW = 8  # tokens of context that, with the token itself, make a repeated pair
POOLED_TEST = "pooled permutation test of the summed centred LLR over list assignments (K={k})"


@dataclass
class PoolSums:
    """Additive statistics of a set of scored tokens. cross: fp64 (L, L) C = sum S^T R; pairs: the green
    membership of each distinct (token, selected list) pair; tail: the tail bound's sums (None: no bound)."""

    cross: torch.Tensor
    n_texts: int = 0
    n_tokens: int = 0
    llr: float = 0.0
    discrete: float = 0.0
    green: int = 0
    dropped: int = 0
    pairs: dict[tuple[int, int], bool] = field(default_factory=dict)
    tail: TailSums | None = None

    @classmethod
    def empty(cls, n_lists: int) -> PoolSums:
        return cls(torch.zeros(n_lists, n_lists, dtype=torch.float64))

    def add(self, stats: TokenStats, targets: torch.Tensor, never_green: torch.Tensor, n_texts: int) -> None:
        """Add a batch of ``n_texts`` texts' token statistics (``stats`` with its residual; targets (N,))."""
        self.n_texts += n_texts
        self.n_tokens += len(stats.llr)
        self.llr += float(stats.llr.double().sum())
        self.discrete += float(stats.discrete.double().sum())
        self.green += int(stats.green.sum())
        self.cross += cross_matrix(stats.selector, stats.residual)
        for t, sel, g in zip(targets.tolist(), stats.selected.tolist(), stats.green.tolist(), strict=True):
            if not never_green[t]:
                self.pairs[(t, sel)] = g

    def merge(self, other: PoolSums) -> PoolSums:
        """The sums of both sets (the tail's sums are not merged)."""
        return PoolSums(
            self.cross + other.cross,
            self.n_texts + other.n_texts,
            self.n_tokens + other.n_tokens,
            self.llr + other.llr,
            self.discrete + other.discrete,
            self.green + other.green,
            self.dropped + other.dropped,
            {**self.pairs, **other.pairs},
        )


def dedupe(items: list[Item], window: int = DEDUPE_WINDOW) -> int:
    """Unscore every token whose (``window`` previous tokens, token) was scored before, in the items' order;
    returns how many were dropped. Uses the token ids only, so the p-value stays exact."""
    seen, dropped = set(), 0
    for item in items:
        seq = item.context + item.text
        keep = []
        for pos, scored in enumerate(item.scored(), item.first):
            if scored:
                pair = hash(tuple(seq[max(0, pos - window) : pos + 1]))
                scored = pair not in seen
                seen.add(pair)
                dropped += not scored
            keep.append(scored)
        item.mask = [False] * (len(item.text) - len(keep)) + keep
    return dropped


def detect_pool(
    detector, texts: list, prompts: list | None = None, *, dedupe_window: int | None = None, progress: bool = False
) -> DetectionResult:
    """One result for the whole set of texts (strings, token ids or ``Chat``s), by ``detector`` (one key).

    Texts of any length count, each token once (or once per context window with ``dedupe_window``);
    ``min_tokens`` applies to the set. Streams in batches of ``config.batch_size`` texts.
    """
    config: DetectConfig = detector.config
    check_config(config)
    items = detector.prepare(texts, prompts)
    dropped = dedupe(items, dedupe_window) if dedupe_window else 0
    todo = sorted((it for it in items if it.n_scored), key=lambda it: -len(it.text))
    sums = PoolSums.empty(detector.key.n_lists)
    sums.dropped, sums.tail = dropped, TailSums.empty(detector.key) if wants_tail(config) else None
    from tqdm.auto import tqdm

    with tqdm(total=len(todo), desc="pooling", unit="text", disable=not progress) as bar:
        for b in range(0, len(todo), config.batch_size):
            batch = todo[b : b + config.batch_size]
            add_batch(detector, batch, sums)
            bar.update(len(batch))
    sums.n_texts = len(items)
    return pooled_result(sums, detector, dedupe_window)


def add_batch(detector, batch: list[Item], sums: PoolSums) -> None:
    """One forward pass over ``batch`` and its statistics added to ``sums`` (and to its tail sums)."""
    fwd = detector.forward(batch)
    stats = detector.statistics(batch, fwd)
    sums.add(stats, fwd.targets.cpu(), detector.never_green, len(batch))
    if sums.tail is not None:
        add_tail(detector, sums.tail, fwd.hidden, fwd.targets, stats)


def check_config(config: DetectConfig) -> None:
    if not config.p_values:
        raise ValueError("pooled detection needs p-values (drop --no-p-values)")
    if config.threshold is not None or config.calibrated:
        raise ValueError("pooled detection decides by its p-value; an LLR threshold is calibrated for one text")


def wants_tail(config: DetectConfig) -> bool:
    """The tail bound needs the exact centring (``centring_top_k`` None)."""
    return config.tail_bound and config.centring_top_k is None


def pooled_result(sums: PoolSums, detector, dedupe_window: int | None = None) -> DetectionResult:
    """The set's result: mean scores, the pooled permutation p-value (refined below its floor by the tail bound
    where ``sums.tail`` is kept), and the decision p <= alpha."""
    config, key, perms = detector.config, detector.key, detector.perms
    if sums.n_tokens < config.min_tokens:
        return DetectionResult(
            status="too_short",
            n_tokens=sums.n_tokens,
            rule=f"needs at least {config.min_tokens} scored tokens",
            n_texts=sums.n_texts,
        )
    n = sums.n_tokens
    statistic, p_value, z = cross_pvalue(sums.cross, perms, key.delta)
    detectors = {
        "llr": sums.llr / n,
        "discrete_llr": sums.discrete / n,
        "green_fraction": sums.green / n,
        **binomial(sums.pairs, key.gamma),
        "centred_llr": statistic / n,
        "permutation_z": z,
        "permutation_p": p_value,
    }
    if dedupe_window:
        detectors["dedupe_dropped"] = sums.dropped
    test = POOLED_TEST.format(k=len(perms))
    if sums.tail is not None and p_value <= 1.0 / (len(perms) + 1):
        p_tail = chernoff_pvalue(sums.tail.terms(statistic), key.delta, key.gamma)
        detectors["tail_p"] = p_tail
        p_value = combined_pvalue(p_value, len(perms), p_tail)
        test += "; below 1/(K+1): Chernoff bound over random keys"
    return DetectionResult(
        status="ok",
        n_tokens=n,
        score=detectors["llr"],
        p_value=p_value,
        test=test,
        decision=p_value <= config.alpha,
        rule=f"pooled p <= {config.alpha:g}",
        detectors=detectors,
        backbone=detector.backbone,
        n_texts=sums.n_texts,
    )


def binomial(pairs: dict[tuple[int, int], bool], gamma: float) -> dict:
    """``decision.binomial`` over the set's distinct (token, selected list) pairs."""
    n, k = len(pairs), sum(pairs.values())
    if n == 0:
        return {"binomial_z": float("nan"), "binomial_p": float("nan"), "binomial_pairs": 0}
    z = (k - gamma * n) / math.sqrt(n * gamma * (1 - gamma))
    return {"binomial_z": z, "binomial_p": float(binom.sf(k - 1, n, gamma)), "binomial_pairs": n}


def source_pvalues(
    detector, texts: list, n_texts: int, n_sources: int, seed: int = 0, *, cache_bytes: int = 4 << 30
) -> list[float]:
    """Pooled p-values of ``n_sources`` random sources, each ``n_texts`` of ``texts`` drawn without replacement.

    Each text is read once: its sums and its states are kept (T x d per text), so a source costs only the
    tail bound's vocabulary pass, and only when its permutation p-value sits at the floor. That pass is
    additive over texts (``TailSums.merge_``), so each text's tail sums are computed once and kept for the
    sources that share it, up to ``cache_bytes`` (an (L, V) fp64 array per text); past it, recomputed.
    """
    check_config(detector.config)
    parts = []  # per text: its sums, and its states and statistics for the tail bound
    for b in range(0, len(texts), detector.config.batch_size):
        batch = [it for it in detector.prepare(texts[b : b + detector.config.batch_size]) if it.n_scored]
        if not batch:
            continue
        fwd = detector.forward(batch)
        stats = detector.statistics(batch, fwd)
        for span in fwd.spans:
            rows = stats_rows(stats, span.start, span.stop)
            sums = PoolSums.empty(detector.key.n_lists)
            sums.add(rows, fwd.targets[span].cpu(), detector.never_green, 1)
            parts.append((sums, fwd.hidden[span], fwd.targets[span], rows))
    if n_texts > len(parts):
        raise ValueError(f"a source of {n_texts} texts needs as many scorable texts; got {len(parts)}")
    per_text = detector.key.n_lists * detector.key.vocab_size * 8
    tails, room = {}, cache_bytes // per_text  # text -> its own TailSums; how many more fit

    def tail_of(i: int) -> TailSums:
        if i in tails:
            return tails[i]
        tail = TailSums.empty(detector.key)
        add_tail(detector, tail, *parts[i][1:])
        if len(tails) < room:
            tails[i] = tail
        return tail

    rng = random.Random(seed)
    p_values = []
    for _ in range(n_sources):
        group = rng.sample(range(len(parts)), n_texts)
        sums = PoolSums.empty(detector.key.n_lists)
        for i in group:
            sums = sums.merge(parts[i][0])
        sums.n_texts = n_texts
        _, p, _ = cross_pvalue(sums.cross, detector.perms, detector.key.delta)
        if wants_tail(detector.config) and p <= 1.0 / (len(detector.perms) + 1):
            sums.tail = TailSums.empty(detector.key)
            for i in group:
                sums.tail.merge_(tail_of(i))
        p_values.append(pooled_result(sums, detector).p_value)
    return p_values


def add_tail(detector, tail: TailSums, hidden: torch.Tensor, targets: torch.Tensor, stats: TokenStats) -> None:
    """Add tokens to the tail bound's sums: hidden (N, d) and targets (N,) of a forward pass, with their stats."""
    head = detector.head
    tail.add(
        hidden,
        targets,
        head.weight,
        head.key,
        stats.selector,
        stats.lse_orig,
        bias=head.bias,
        head_is_watermarked=head.is_watermarked,
        block=detector.config.vocab_block,
    )
