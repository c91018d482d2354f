"""A frontier that holds (issue 78): the protocol that places OpenStamp against its peers at equal cost.

    python benchmarks/frontier/protocol.py --model smollm2-135m --out runs/protocol/plan.json

What it fixes before anything runs, so no number is tuned on the data it is reported on:

* **Splits by document.** The corpus's ``key`` part builds keys (``openstamp.corpus.split_documents``); its
  ``heldout`` part is cut again by a second salted hash into ``tune`` (every setting: key hyper-parameters, delta,
  the grids), ``test`` (the prompts and the human continuations they are compared with) and ``thresholds`` (human
  text whose scores set each method's 1% FPR threshold, at least 1,000 texts per length). No document sits in two
  parts: ``check_disjoint`` compares the parts' sha256 sets and raises.
* **Keys and prompts.** At least 5 fresh keys per method (``test_seeds``, none of them a ``tune_seeds`` seed) and
  at least 400 test prompts, scored at 16, 32, 64 and 200 tokens.
* **A dense grid per method.** At least 6 strengths whose own-PPL change lies in [+2%, +25%], and for each target
  cost (+5%, +10%, +20%) a point on each side within 4 percentage points (``grid_gaps`` names what is missing).
* **Paired differences.** The default minus KGW+LLR at each length and target cost, interpolated linearly and under
  the budget model, with a bootstrap over prompts and keys jointly (``openstamp.lab.evaluation.paired``).

This script writes the plan: the parts' sizes and fingerprints, the seeds, and whether the corpus supplies the
prompts and threshold texts the config asks for (the JSON is written atomically). The run itself is the lab's
``openstamp eval --sweep`` over each part.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from openstamp.config import check, option
from openstamp.corpus import Document, fingerprint, split_documents
from openstamp.lab.evaluation.paired import INTERPOLATIONS, tpr_difference

PROTOCOL_SALT = b"openstamp/protocol-split/v1"
PARTS = ("key", "tune", "test", "thresholds")


@dataclass(frozen=True, kw_only=True)
class ProtocolConfig:
    """The frontier protocol's settings (issue 78), validated on construction."""

    method: str = option("openstamp", "the method compared")
    baseline: str = option("kgw-llr", "the method it is compared with (paired differences: method minus baseline)")
    heldout_fraction: float = option(0.5, "share of documents in the corpus's held-out part (the rest build keys)")
    tune_fraction: float = option(0.2, "share of held-out documents that tune settings")
    test_fraction: float = option(0.3, "share of held-out documents that give test prompts (the rest: thresholds)")
    lengths: tuple[int, ...] = option((16, 32, 64, 200), "scored tokens at which every comparison is made")
    prompt_tokens: int = option(50, "tokens of real text per prompt")
    n_test_prompts: int = option(400, "test prompts per method and key")
    prompts_per_document: int = option(2, "most prompts one test document gives (the bootstrap treats them alike)")
    min_threshold_texts: int = option(1000, "human texts per length that set each threshold")
    tune_seeds: tuple[int, ...] = option((0, 1, 2), "key seeds used while tuning")
    test_seeds: tuple[int, ...] = option((100, 101, 102, 103, 104), "fresh key seeds for the test, none tuned on")
    fpr: float = option(0.01, "false-positive rate of every threshold")
    targets: tuple[float, ...] = option((0.05, 0.10, 0.20), "own-PPL changes at which methods are compared")
    cost_range: tuple[float, float] = option((0.02, 0.25), "own-PPL change range a grid's points must cover")
    min_grid_points: int = option(6, "strengths per method inside cost_range")
    bracket_window: float = option(0.04, "each target needs a grid point on each side within this own-PPL change")
    n_boot: int = option(2000, "bootstrap replicates of each paired difference")

    def __post_init__(self) -> None:
        check(0 < self.heldout_fraction < 1, "heldout_fraction must be in (0, 1)")
        check(self.tune_fraction > 0 and self.test_fraction > 0, "tune_fraction and test_fraction must be positive")
        check(self.tune_fraction + self.test_fraction < 1, "tune and test fractions must leave thresholds")
        check(len(self.lengths) >= 1 and all(n >= 1 for n in self.lengths), "lengths must be token counts >= 1")
        check(self.n_test_prompts >= 400, "the protocol needs at least 400 test prompts")
        check(self.prompts_per_document >= 1 and self.prompt_tokens >= 1, "need >= 1 prompt per document and token")
        check(self.min_threshold_texts >= 1000, "thresholds need at least 1,000 human texts per length")
        check(len(set(self.test_seeds)) >= 5, "the protocol needs at least 5 fresh test keys per method")
        check(not set(self.test_seeds) & set(self.tune_seeds), "a test key seed must not be one used in tuning")
        check(0 < self.fpr < 0.5, "fpr must be in (0, 0.5)")
        low, high = self.cost_range
        check(0 < low < high, "cost_range must be (low, high) with 0 < low < high")
        check(all(low <= t <= high for t in self.targets), "every target must lie inside cost_range")
        check(self.min_grid_points >= 6, "the protocol needs at least 6 grid points per method")
        check(self.bracket_window > 0 and self.n_boot >= 100, "bracket_window > 0 and n_boot >= 100")


def _unit_hash(doc: Document) -> float:
    digest = hashlib.sha256(PROTOCOL_SALT + bytes.fromhex(doc.sha256)).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def split_protocol(docs: list[Document], cfg: ProtocolConfig) -> dict[str, list[Document]]:
    """The four parts: ``key`` (the corpus's key part) and the held-out part cut into ``tune``, ``test`` and
    ``thresholds`` by a second hash of each document's sha256 (so equal texts land together). Checked disjoint."""
    parts = {"key": split_documents(docs, "key", cfg.heldout_fraction), "tune": [], "test": [], "thresholds": []}
    for doc in split_documents(docs, "heldout", cfg.heldout_fraction):
        u, tune = _unit_hash(doc), cfg.tune_fraction
        parts["tune" if u < tune else "test" if u < tune + cfg.test_fraction else "thresholds"].append(doc)
    check_disjoint(parts)
    return parts


def check_disjoint(parts: dict[str, list[Document]]) -> None:
    """Raise ValueError naming every pair of parts that share a document (by sha256 of its text)."""
    hashes = {name: {d.sha256 for d in docs} for name, docs in parts.items()}
    names = list(hashes)
    shared = [
        f"{a} and {b} share {len(hashes[a] & hashes[b])}"
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if hashes[a] & hashes[b]
    ]
    if shared:
        raise ValueError("documents sit in two parts: " + "; ".join(shared))


def grid_gaps(costs: list[float], cfg: ProtocolConfig) -> dict:
    """What a method's grid (each strength's own-PPL change) lacks: how many points it has inside ``cost_range``
    against ``min_grid_points``, and each target without a point within ``bracket_window`` below it ("below") or
    above it ("above"). Empty ``targets`` and ``enough`` True: the grid holds."""
    low, high = cfg.cost_range
    inside = sum(low <= c <= high for c in costs)
    missing = {}
    for t in cfg.targets:
        sides = [
            side
            for side, ok in (
                ("below", any(t - cfg.bracket_window <= c <= t for c in costs)),
                ("above", any(t <= c <= t + cfg.bracket_window for c in costs)),
            )
            if not ok
        ]
        if sides:
            missing[t] = sides
    return {"points_in_range": inside, "enough": inside >= cfg.min_grid_points, "targets": missing}


def windows(token_counts: list[int], size: int, per_document: int | None = None) -> int:
    """Non-overlapping windows of ``size`` tokens the documents give (at most ``per_document`` each)."""
    counts = [n // size for n in token_counts]
    return sum(counts if per_document is None else [min(c, per_document) for c in counts])


def supply(parts: dict[str, list[int]], cfg: ProtocolConfig) -> dict:
    """Whether the test and thresholds parts (each document's token count) give what the config asks: test
    prompts (windows of prompt + longest length, ``prompts_per_document`` at most) and threshold texts per length
    (windows of the longest length, each cut to every length as the eval's length curve cuts them)."""
    longest = max(cfg.lengths)
    prompts = windows(parts["test"], cfg.prompt_tokens + longest, cfg.prompts_per_document)
    per_length = {n: windows(parts["thresholds"], longest) for n in cfg.lengths}
    return {
        "test_prompts": prompts,
        "test_prompts_enough": prompts >= cfg.n_test_prompts,
        "threshold_texts": per_length,
        "threshold_texts_enough": all(v >= cfg.min_threshold_texts for v in per_length.values()),
    }


def paired_rows(grids: dict[str, dict], cfg: ProtocolConfig) -> list[dict]:
    """The method minus the baseline at every length, target and interpolation.

    Args:
        grids: per method name, ``{"costs": [G own-PPL changes], "hits": {length: bool (K, N, G)}}``: whether key
            k's text for test prompt n at grid point g, cut to ``length`` tokens, passes the threshold set on the
            thresholds part at ``cfg.fpr``.
    """
    a, b = grids[cfg.method], grids[cfg.baseline]
    rows = []
    for length in cfg.lengths:
        for target in cfg.targets:
            for how in INTERPOLATIONS:
                row = tpr_difference(
                    target, a["costs"], a["hits"][length], b["costs"], b["hits"][length], how, cfg.fpr, cfg.n_boot
                )
                rows.append({"length": length, **row})
    return rows


def plan(docs: list[Document], cfg: ProtocolConfig, count_tokens) -> dict:
    """The plan a run follows: the config, each part's size and fingerprint, and the corpus's supply
    (``count_tokens``: list of texts -> list of token counts)."""
    parts = split_protocol(docs, cfg)
    counts = {name: count_tokens([d.text for d in part]) for name, part in parts.items()}
    prints = {name: fingerprint(part) for name, part in parts.items()}
    return {
        "config": asdict(cfg),
        "parts": {
            n: {"documents": len(parts[n]), "tokens": int(np.sum(counts[n])), "sha256": prints[n]["sha256"]}
            for n in PARTS
        },
        "documents": {n: prints[n]["documents"] for n in PARTS},
        "supply": supply(counts, cfg),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="news,wikipedia", help="corpus specs, comma-separated")
    parser.add_argument("--model", default="smollm2-135m", help="model whose tokenizer counts tokens")
    parser.add_argument("--out", type=Path, default=Path("runs/protocol/plan.json"))
    args = parser.parse_args(argv)

    from openstamp.corpus import load_corpora
    from openstamp.model.load import load_tokenizer
    from openstamp.model.text import encode
    from openstamp.storage import atomic_write_json

    cfg, tokenizer = ProtocolConfig(), load_tokenizer(args.model)
    result = plan(load_corpora(args.corpus), cfg, lambda texts: [len(ids) for ids in encode(tokenizer, texts)])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, {"corpus": args.corpus, "model": args.model, **result})
    for name, part in result["parts"].items():
        print(f"{name:10s} {part['documents']:6d} documents {part['tokens']:9d} tokens")
    s = result["supply"]
    print(f"test prompts {s['test_prompts']} (need {cfg.n_test_prompts}); threshold texts {s['threshold_texts']}")
    return 0 if s["test_prompts_enough"] and s["threshold_texts_enough"] else 1


if __name__ == "__main__":
    sys.exit(main())
