"""The eval's scoring stages, one cached file per generation set or run (the layout is in ``pipeline``).

The detectors on watermarked, human and unwatermarked text (``score_run``), the model's own perplexity on the
human continuations (``score_own_ppl``), its lm-eval accuracy (``score_downstream``) and the oracle's perplexity
of every completion set (``score_perplexity``). The pipeline calls them with the model as it generates.
"""

from __future__ import annotations

import logging

from openstamp.lab.detector import p_values_down_to
from openstamp.lab.evaluation.downstream import accuracy, build_local_tasks, processed_logits, task_names
from openstamp.lab.evaluation.lengths import LEVEL
from openstamp.lab.evaluation.oracle import load_perplexities, perplexities, save_perplexities
from openstamp.lab.evaluation.results import load_generations
from openstamp.lab.hidden import lab_hidden
from openstamp.lab.methods.base import score_dicts
from openstamp.model.load import fast_dtype, load_model
from openstamp.model.perplexity import window_nll
from openstamp.model.text import bos_prefix
from openstamp.storage import atomic_write_json

log = logging.getLogger(__name__)


def score_downstream(out, name, model, tokenizer, processor, cfg) -> None:
    """Per-item accuracy on cfg.downstream's lm-eval tasks of the model as it generates now (cached per set)."""
    if not cfg.downstream:
        return

    path = out / "downstream" / f"{name.replace('/', '_')}.json"
    if path.exists():
        return
    task_dir = out / "downstream" / "tasks"
    if not (task_dir / "done").exists():
        task_dir.mkdir(parents=True, exist_ok=True)
        build_local_tasks(task_dir, cfg.corpus, cfg.downstream_limit)
        (task_dir / "done").touch()
    log.info("downstream accuracy of %s", name)
    with processed_logits(model, processor):
        acc = accuracy(
            model, tokenizer, task_names(cfg.downstream), task_dir, cfg.downstream_limit, cfg.score_batch_size
        )
    atomic_write_json(path, acc)


def score_own_ppl(out, name, model, tokenizer, windows, processor, cfg, progress) -> None:
    """The model's own NLL on each human continuation given its prompt, as it generates now."""
    path = out / "own_ppl" / f"{name.replace('/', '_')}.json"
    if path.exists():
        return
    bos = bos_prefix(tokenizer)
    pairs = [(bos + w["prompt"], w["human"]) for w in windows]
    nll = window_nll(model, pairs, processor, cfg.score_batch_size, progress, hidden=lab_hidden)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, nll)


def score_run(out, run, gen_name, method, model, tokenizer, windows, seed, cfg, memo=None) -> None:
    """The run's detector on its watermarked text and on both negative sets, all as decoded text (``memo``: see
    ``openstamp.lab.methods.base.score_dicts``).

    The eval decides p <= ``LEVEL`` only, so OpenStamp's detector skips its tail bound here, as in the length
    curve (``openstamp.lab.detector.p_values_down_to``): a watermarked text's p-value stops at the permutation
    test's floor 1/(K + 1) = 0.001, where `openstamp detect` goes on below it. Every decision is the same."""
    path = out / "scores" / f"{run.replace('/', '_')}.json"
    if path.exists():
        return
    sets = {
        "watermarked": load_generations(out, gen_name),
        "human": [w["human"] for w in windows],
        "unwatermarked": load_generations(out, f"unwatermarked/s{seed}"),
    }
    scores = {}
    for name, ids in sets.items():
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        with p_values_down_to(LEVEL):
            scores[name] = score_dicts(method, model, tokenizer, texts, cfg.score_batch_size, memo)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, scores)


def score_perplexity(out, cfg, tokenizer, windows, runs, progress) -> None:
    """Oracle perplexity of every completion set given its prompts (and of the human continuations), in the dtype
    cfg.oracle_dtype resolves to; a set scored in another dtype is scored again."""
    dtype = oracle_dtype(cfg)
    prompts = tokenizer.batch_decode([w["prompt"] for w in windows], skip_special_tokens=True)
    sets = {"human": [w["human"] for w in windows]}
    for seed in cfg.seeds:
        sets[f"unwatermarked/s{seed}"] = None
    for r in runs:
        sets[r["generations"]] = None
    path = lambda name: out / "ppl" / f"{name.replace('/', '_')}.json"  # noqa: E731
    todo = [s for s in sets if not path(s).exists() or load_perplexities(path(s), cfg.dtype)["dtype"] != dtype]
    if not todo:
        return
    log.info("oracle %s in %s: %d sets", cfg.oracle, dtype, len(todo))
    oracle, oracle_tok = load_model(cfg.oracle, dtype=dtype, device=cfg.device)
    for name in todo:
        ids = sets[name] if sets[name] is not None else load_generations(out, name)
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        values = perplexities(oracle, oracle_tok, prompts, texts, progress=progress)
        save_perplexities(path(name), values, cfg.oracle, dtype)


def oracle_dtype(cfg) -> str:
    """The dtype cfg.oracle_dtype names; 'fast' is bfloat16 where cfg.device computes it natively, else float32."""
    return fast_dtype(cfg.device) if cfg.oracle_dtype == "fast" else cfg.oracle_dtype
