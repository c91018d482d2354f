"""Token edits: delete, substitute and insert random model tokens at given rates, then re-score.

Each token of a watermarked completion is, independently, deleted with probability ``delete``,
else replaced by a uniformly random ordinary token with probability ``substitute``; independently,
a random token is inserted at its position with probability ``insert``. Sample ``i`` of every
generation set uses the random stream ``(seed, i)``, so all methods see the same edit pattern.
Cheap (no generation), so CI exercises the whole attack path with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from openstamp.config import check, option
from openstamp.lab.attacks.common import (
    AT_COST_HELP,
    attacked_metrics,
    cached_json,
    check_at_cost,
    config_dict,
    cost_note,
    file_name,
    load_method,
    open_eval,
    prepare_out,
    score_texts,
    select_runs,
)
from openstamp.lab.attacks.report import (
    compare_plot,
    compare_row,
    compare_summary,
    compare_table,
    negatives_note,
    publish,
)
from openstamp.model.load import load_model
from openstamp.model.patch import head
from openstamp.model.text import never_green_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EditConfig:
    delete: float = option(0.1, "probability that a token is deleted")
    substitute: float = option(0.1, "probability that a (not deleted) token is replaced by a random token")
    insert: float = option(0.0, "probability that a random token is inserted at each token's position")
    seed: int = option(0, "seed of the edit pattern")
    methods: tuple[str, ...] | None = option(None, "methods to attack (default: every method of the eval run)")
    at_cost: float | None = option(None, AT_COST_HELP)

    def __post_init__(self) -> None:
        rates = (self.delete, self.substitute, self.insert)
        check(all(0.0 <= r <= 1.0 for r in rates), "edit rates must be in [0, 1]")
        check(self.delete + self.substitute <= 1.0, "delete + substitute must be at most 1")
        check_at_cost(self.at_cost)


def edit_tokens(
    ids: list[int], cfg: EditConfig, candidates: np.ndarray, rng: np.random.Generator
) -> tuple[list[int], dict[str, int]]:
    """Apply random edits to one token sequence.

    Args:
        ids: the token ids.
        candidates: (k,) ids that substitutions and insertions draw from uniformly.
    Returns:
        the edited ids and the counts of deleted, substituted and inserted tokens.
    """
    u = rng.random(len(ids))
    inserted = rng.random(len(ids)) < cfg.insert
    draws = candidates[rng.integers(0, len(candidates), 2 * len(ids))]
    out, counts = [], {"tokens": len(ids), "deleted": 0, "substituted": 0, "inserted": 0}
    for t, token in enumerate(ids):
        if u[t] < cfg.delete:
            counts["deleted"] += 1
        elif u[t] < cfg.delete + cfg.substitute:
            out.append(int(draws[2 * t]))
            counts["substituted"] += 1
        else:
            out.append(int(token))
        if inserted[t]:
            out.append(int(draws[2 * t + 1]))
            counts["inserted"] += 1
    return out, counts


def edit_set(completions: list[list[int]], cfg: EditConfig, candidates: np.ndarray) -> dict:
    """Edit every completion; sample ``i`` uses the stream ``(seed, i)``."""
    edited, totals = [], {"tokens": 0, "deleted": 0, "substituted": 0, "inserted": 0}
    for i, ids in enumerate(completions):
        new, counts = edit_tokens(ids, cfg, candidates, np.random.default_rng([cfg.seed, i]))
        edited.append(new)
        totals = {k: totals[k] + counts[k] for k in totals}
    return {"ids": edited, "counts": totals}


def run_edit(eval_dir: Path, out: Path, cfg: EditConfig, progress: bool = True) -> dict:
    """Edit every selected run's watermarked completions, re-score them, and report before/after."""
    ev = open_eval(eval_dir)
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    vocab = head(base).weight.shape[0]
    excluded = set(never_green_ids(tokenizer, vocab))
    candidates = np.array([i for i in range(min(len(tokenizer), vocab)) if i not in excluded])
    rows, rates = [], {}
    for run in select_runs(ev, cfg.methods, cfg.at_cost):
        gen = run["generations"]
        edited = cached_json(out / "edited" / f"{file_name(gen)}.json", edit_set, ev.generations(run), cfg, candidates)
        counts = edited["counts"]
        rates[gen] = {k: counts[k] / max(counts["tokens"], 1) for k in ("deleted", "substituted", "inserted")}
        method = load_method(ev, run, base)
        texts = tokenizer.batch_decode(edited["ids"], skip_special_tokens=True)
        if progress:
            log.info("scoring edited %s", run["run"])
        path = out / "scores" / f"{file_name(run['run'])}.json"
        scores = cached_json(path, score_texts, method, base, tokenizer, texts, ev.cfg)
        eval_scores = ev.scores(run)
        before = attacked_metrics(eval_scores["watermarked"], eval_scores)
        rows.append(compare_row(run, before, attacked_metrics(scores, eval_scores)))
    summary = compare_summary(rows)
    label = f"delete {cfg.delete:g}, substitute {cfg.substitute:g}, insert {cfg.insert:g}"
    plot = compare_plot(summary, out / "edit_tpr.png", f"token edits ({label})", "edited")
    mean_rates = {k: float(np.mean([r[k] for r in rates.values()])) for k in ("deleted", "substituted", "inserted")}
    body = [
        f"Random token edits of every watermarked completion of `{ev.path}` ({label}; seed {cfg.seed}), on the "
        "watermarked model's own tokens; substitutions and insertions draw uniformly from its ordinary tokens. "
        f"Realised fractions of the original tokens: deleted {mean_rates['deleted']:.3f}, substituted "
        f"{mean_rates['substituted']:.3f}, inserted {mean_rates['inserted']:.3f}. Each method's unchanged detector "
        f"scores the edited text with the original model. {negatives_note(ev)} Cells: mean ± sd over seeds."
        + cost_note(ev, cfg.at_cost, rows),
        "",
        *compare_table(summary, "edited"),
    ]
    results = {
        "settings": config_dict(cfg),
        "eval": str(ev.path),
        "realised_rates": rates,
        "runs": rows,
        "summary": summary,
    }
    publish(out, "edit", f"token edits ({label})", body, [plot], results, ev.path)
    return results
