"""Paraphrasing: an instruct model rewrites each watermarked completion; the unchanged detectors re-score it.

The request is the paper's template (Appendix, "Paraphrasing attack setup") sent as one user turn
through the paraphraser's chat template; sampling is top-p 0.9 at temperature 0.7 (beam search
with ``beams=3``, as in the paper, where affordable). Paraphrases are cached per batch and shared
by every run that shares a generation set.

How real the attack is gets measured, because a "paraphrase" that copies its input is no attack:
the cosine similarity of original and paraphrase under the packaged MiniLM (the paper reports
0.92 with another embedder), the fraction of the original's distinct 3-grams that survive (of
the watermarked model's tokens, and of lower-cased words), and the fraction of near-copies.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import check, option
from openstamp.detect.rates import clopper_pearson, threshold_at_fpr
from openstamp.lab.attacks.common import (
    AT_COST_HELP,
    attacked_metrics,
    cached_json,
    check_at_cost,
    config_dict,
    cost_note,
    file_name,
    load_method,
    mean_score,
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
    fmt,
    md_table,
    negatives_note,
    publish,
)
from openstamp.lab.attacks.similarity import measure_quality, similarity_plot
from openstamp.model.load import load_model, load_tokenizer, model_device
from openstamp.model.text import bos_prefix, encode
from openstamp.storage import atomic_write_json, atomic_write_text, read_json

log = logging.getLogger(__name__)

PAPER_INSTRUCTION = (
    "Instruction: The input contains a Prompt and its Completion. Paraphrase ONLY the Completion. "
    "Preserve the exact meaning, facts, scope, and intent. Do not add, remove, infer, or reinterpret any "
    "information. Change wording and sentence structure only."
)
INSTRUCTIONS = {
    "paper": PAPER_INSTRUCTION,
    "strong": PAPER_INSTRUCTION
    + " Rewrite every sentence in your own words: use different vocabulary and a different sentence structure "
    "throughout, and never copy more than three consecutive words from the Completion. Output only the "
    "paraphrased Completion.",
}


@dataclass(frozen=True, kw_only=True)
class ParaphraseConfig:
    paraphraser: str = option(
        "qwen2.5-coder-1.5b", "instruct model (any HF chat model; qwen2.5-coder-0.5b is the faster packaged one)"
    )
    prompt: str = option("paper", "'paper' (the paper's instruction) or 'strong' (also forbids copying phrases)")
    n: int | None = option(None, "paraphrase only the first n completions of each generation set (default: all)")
    temperature: float = option(0.7, "sampling temperature (0: greedy)")
    top_p: float = option(0.9, "nucleus sampling")
    beams: int = option(1, "beam width (the paper uses 3; each beam costs a full generation on a CPU)")
    max_new_tokens: int | None = option(
        None, "tokens per paraphrase (default: 1.5 x the longest original in the batch, plus 16)"
    )
    batch_size: int = option(8, "paraphrases per generate call (left-padded)")
    embedder: str = option("minilm", "sentence embedder for the similarity figure")
    near_copy: float = option(
        0.8, "a paraphrase keeping at least this fraction of the original's token 3-grams is a near-copy"
    )
    seed: int = option(0, "sampling seed (batch b uses seed * 100003 + b)")
    methods: tuple[str, ...] | None = option(None, "methods to attack (default: every method of the eval run)")
    at_cost: float | None = option(None, AT_COST_HELP)
    dtype: str = option("float32", "paraphraser dtype")
    device: str = option("cpu", "paraphraser device")

    def __post_init__(self) -> None:
        check(self.prompt in INSTRUCTIONS, f"prompt must be one of {sorted(INSTRUCTIONS)}")
        check(self.n is None or self.n >= 1, "n must be >= 1")
        check(self.temperature >= 0 and 0 < self.top_p <= 1, "need temperature >= 0 and top_p in (0, 1]")
        check(self.beams >= 1 and self.batch_size >= 1, "beams and batch_size must be >= 1")
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "max_new_tokens must be >= 1")
        check(0 < self.near_copy <= 1, "near_copy must be in (0, 1]")
        check_at_cost(self.at_cost)


def request_text(prompt: str, completion: str, style: str = "paper") -> str:
    """The paper's paraphrase request for one (prompt, completion) pair."""
    return f"{INSTRUCTIONS[style]}\n\nPrompt:\n{prompt}\n\nCompletion:\n{completion}\n\nParaphrased Completion:"


def request_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """One user turn through the chat template (plain text with BOS when the tokenizer has none)."""
    if getattr(tokenizer, "chat_template", None):
        chat = [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return tokenizer(rendered, add_special_tokens=False).input_ids
    return bos_prefix(tokenizer) + encode(tokenizer, [text])[0]


def clean(text: str) -> str:
    """Strip whitespace, an echoed 'Paraphrased Completion:' label and wrapping quotes."""
    text = re.sub(r"^\s*(paraphrased completion|paraphrase)\s*:\s*", "", text.strip(), flags=re.IGNORECASE)
    if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    return text.strip()


END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")  # chat models' end-of-reply tokens


def _stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS of the generation config and the tokenizer, and any end-of-turn token the vocabulary has."""
    ids = model.generation_config.eos_token_id
    ids = set() if ids is None else {ids} if isinstance(ids, int) else set(ids)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    return sorted(ids | {vocab[t] for t in END_OF_TURN if t in vocab})


@torch.inference_mode()
def paraphrase_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    completions: Sequence[str],
    cfg: ParaphraseConfig,
    seed: int,
) -> list[str]:
    """Paraphrase one batch with left padding; returns the cleaned paraphrases."""
    requests = [
        request_ids(tokenizer, request_text(p, c, cfg.prompt)) for p, c in zip(prompts, completions, strict=True)
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(map(len, requests))
    ids = torch.full((len(requests), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(requests):
        ids[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r), 1
    budget = cfg.max_new_tokens or int(1.5 * max(map(len, encode(tokenizer, list(completions))), default=0)) + 16
    sampling = (
        {"do_sample": True, "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": 0}
        if cfg.temperature > 0
        else {"do_sample": False}
    )
    torch.manual_seed(seed)
    device = model_device(model)
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=budget,
        num_beams=cfg.beams,
        pad_token_id=pad,
        eos_token_id=_stop_ids(model, tokenizer),
        **sampling,
    )
    return [clean(t) for t in tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)]


def paraphrase_sets(
    out: Path, originals: dict[str, list[str]], prompts: list[str], cfg: ParaphraseConfig, progress: bool
) -> dict[str, list[str]]:
    """Paraphrases of every generation set, batch by batch; the paraphraser loads only if a batch is missing."""
    loaded: tuple | None = None
    result = {}
    for gen, texts in originals.items():
        result[gen] = []
        for b, start in enumerate(range(0, len(texts), cfg.batch_size)):
            path = out / "paraphrases" / file_name(gen) / f"b{b:04d}.json"
            if not path.exists():
                if loaded is None:
                    log.info("loading paraphraser %s", cfg.paraphraser)
                    loaded = load_model(cfg.paraphraser, dtype=cfg.dtype, device=cfg.device)
                if progress:
                    log.info("paraphrasing %s: batch %d of %d", gen, b + 1, -(-len(texts) // cfg.batch_size))
                end = start + cfg.batch_size
                batch = paraphrase_batch(*loaded, prompts[start:end], texts[start:end], cfg, cfg.seed * 100_003 + b)
                atomic_write_json(path, batch)
            result[gen].extend(read_json(path, "paraphrase batch"))
    return result


def run_paraphrase(eval_dir: Path, out: Path, cfg: ParaphraseConfig, progress: bool = True) -> dict:
    """Paraphrase the selected runs' watermarked completions, re-score them, and report."""
    ev = open_eval(eval_dir)
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    runs = select_runs(ev, cfg.methods, cfg.at_cost)
    n = min(cfg.n or len(ev.windows), len(ev.windows))
    tokenizer = load_tokenizer(ev.cfg.model)
    prompts = tokenizer.batch_decode(ev.prompts(n), skip_special_tokens=True)
    first: dict[str, dict] = {}
    for run in runs:  # runs that share a generation set share its paraphrases
        first.setdefault(run["generations"], run)
    originals = {
        gen: tokenizer.batch_decode(ev.generations(run)[:n], skip_special_tokens=True) for gen, run in first.items()
    }
    paraphrases = paraphrase_sets(out, originals, prompts, cfg, progress)
    quality = {
        gen: cached_json(
            out / "quality" / f"{file_name(gen)}.json",
            measure_quality,
            originals[gen],
            paraphrases[gen],
            tokenizer,
            cfg.embedder,
            cfg.near_copy,
        )
        for gen in originals
    }
    _write_samples(out, prompts, originals, paraphrases, quality)
    base, _ = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    rows = []
    for run in runs:
        if progress:
            log.info("scoring paraphrased %s", run["run"])
        method, eval_scores = load_method(ev, run, base), ev.scores(run)
        path = out / "scores" / f"{file_name(run['run'])}.json"
        scores = cached_json(path, score_texts, method, base, tokenizer, paraphrases[run["generations"]], ev.cfg)
        before = attacked_metrics(eval_scores["watermarked"][:n], eval_scores)
        row = compare_row(run, before, attacked_metrics(scores, eval_scores))
        row["generations"] = run["generations"]
        survival = quality[run["generations"]]["token_3gram_survival"]
        human = _human_cut(out, run, method, base, tokenizer, ev, scores, survival, cfg.near_copy)
        row["real"] = real_paraphrases(
            eval_scores["watermarked"][:n], scores, eval_scores, survival, cfg.near_copy, human
        )
        rows.append(row)
    summary = compare_summary(rows)
    plots = [
        similarity_plot(quality, out / "paraphrase_similarity.png"),
        compare_plot(summary, out / "paraphrase_tpr.png", "paraphrasing", "paraphrased"),
    ]
    body = _section(ev, cfg, n, summary, quality, rows)
    results = {
        "settings": config_dict(cfg),
        "eval": str(ev.path),
        "n": n,
        "quality": {gen: q["summary"] for gen, q in quality.items()},
        "runs": rows,
        "summary": summary,
    }
    publish(out, "paraphrase", f"paraphrasing ({cfg.paraphraser}, {cfg.prompt} prompt)", body, plots, results, ev.path)
    return results


def kept(survival: list[float], near_copy: float) -> list[int]:
    """The indices of the paraphrases that are not near-copies (token 3-gram survival below ``near_copy``)."""
    return [i for i, s in enumerate(survival) if s < near_copy]


def cut_to(human: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """The human continuations' token ids cut to the paraphrases' lengths in turn, the j-th to ``lengths[j mod
    len(lengths)]`` scored tokens (L + 1 ids, the first having no context, as in the length curve): negatives whose
    lengths are spread as the positives' are, where ``human`` is at least as long."""
    return [ids[: lengths[j % len(lengths)] + 1] for j, ids in enumerate(human)]


def _human_cut(out, run, method, base, tokenizer, ev, scores, survival, near_copy) -> list[dict] | None:
    """The run's detector on the eval's human continuations cut to its kept paraphrases' scored lengths
    (:func:`cut_to`); cached per run with the cut it made, and made again when the paraphrases' lengths change."""
    lengths = [scores[i]["n_tokens"] for i in kept(survival, near_copy) if scores[i]["score"] is not None]
    if not lengths:
        return None
    ids = cut_to([w["human"] for w in ev.windows], lengths)
    path = out / "scores" / f"{file_name(run['run'])}-human-cut.json"
    cached = read_json(path, "human-cut scores") if path.exists() else {}
    if cached.get("ids") != [len(x) for x in ids]:
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        cached = {"ids": [len(x) for x in ids], "scores": score_texts(method, base, tokenizer, texts, ev.cfg)}
        atomic_write_json(path, cached)
    return cached["scores"]


def real_paraphrases(
    before: list[dict],
    after: list[dict],
    eval_scores: dict,
    survival: list[float],
    near_copy: float,
    human_cut: list[dict] | None = None,
) -> dict:
    """Detection on the paraphrases that are not near-copies (token 3-gram survival below ``near_copy``).

    ``before`` and ``after`` are the score records of the same completions unparaphrased and paraphrased.
    TPR@1%FPR gets an exact (Clopper-Pearson) 95% interval over the kept texts; the mean scores show
    how far the detector's statistic moved where TPR saturates. The TPR's threshold comes from the eval's human
    texts, which are as long as the completions, while paraphrases run shorter; so, for a method with p-values, the
    fraction flagged at p <= 0.01 is recorded too: the p-value holds at every length.

    ``human_cut``, the detector's records of the human continuations cut to the kept paraphrases' lengths
    (:func:`cut_to`), splits the gap between the two: ``human_cut.over_threshold`` is how many of them the TPR's
    threshold flags (the false-positive rate it really has at these lengths, 1% if length did not matter),
    ``human_cut.flagged_at_p_0.01`` how many the p-value flags, and ``human_cut.tpr_at_1pct_fpr`` the kept
    paraphrases' TPR with the threshold chosen on the cut texts, at their lengths. ``scores`` (the kept paraphrases')
    and ``human_cut.scores`` keep each text's score, so that a summary can redraw both and the threshold with them.
    """
    keep = kept(survival, near_copy)
    if not keep:
        return {"n": 0}
    was, now = ([records[i] for i in keep] for records in (before, after))
    metrics = attacked_metrics(now, eval_scores)
    tpr = metrics["tpr_at_1pct_fpr"]
    out = {
        "n": len(keep),
        "tpr_at_1pct_fpr_before": attacked_metrics(was, eval_scores)["tpr_at_1pct_fpr"],
        "tpr_at_1pct_fpr_after": tpr,
        "tpr_at_1pct_fpr_after_ci": clopper_pearson(round(tpr * len(keep)), len(keep)),
        "auroc_after": metrics["auroc"],
        "mean_score_before": mean_score(was),
        "mean_score_after": mean_score(now),
        "flagged_at_p_0.01": metrics.get("flagged_at_p_0.01"),
        "scores": metrics["scores"],  # the kept paraphrases', so that a summary can redraw them with the threshold
    }
    if human_cut is not None and (matched := _at_their_lengths(now, human_cut, eval_scores)) is not None:
        out["human_cut"] = matched
    return out


def _at_their_lengths(now: list[dict], human_cut: list[dict], eval_scores: dict) -> dict | None:
    """The kept paraphrases (``now``) against human text cut to their lengths (see :func:`real_paraphrases`); None
    where the detector scored none of the cut texts (each too short)."""
    cut = np.array([r["score"] for r in human_cut if r["score"] is not None], dtype=np.float64)
    if not len(cut):
        return None
    full = [r["score"] for r in eval_scores["human"] if r["score"] is not None]
    matched = attacked_metrics(now, {**eval_scores, "human": human_cut})
    tpr = matched["tpr_at_1pct_fpr"]
    return {
        "n": len(cut),
        "over_threshold": float(np.mean(cut > threshold_at_fpr(full, 0.01))),
        "flagged_at_p_0.01": matched.get("human_flagged_at_p_0.01"),
        "tpr_at_1pct_fpr": tpr,
        "tpr_at_1pct_fpr_ci": clopper_pearson(round(tpr * len(now)), len(now)),
        "scores": [r["score"] for r in human_cut],  # the threshold's texts, to redraw with the paraphrases'
    }


def _real_table(rows: list[dict], near_copy: float) -> list[str]:
    """Per run: detection on the paraphrases that are not near-copies; the figures that hold at the paraphrases'
    lengths lead (in bold the TPR at their lengths, where it was measured), the full-length threshold's after."""
    cells = []
    for row in rows:
        r = row["real"]
        if not r["n"]:
            cells.append([row["run"], "0", *["-"] * 8])
            continue
        cut = r.get("human_cut") or {}
        matched = _with_ci(cut.get("tpr_at_1pct_fpr"), cut.get("tpr_at_1pct_fpr_ci"))
        full = _with_ci(r["tpr_at_1pct_fpr_after"], r["tpr_at_1pct_fpr_after_ci"])
        matched, full = (f"**{matched}**", full) if cut else (matched, f"**{full}**")
        cells.append(
            [
                row["run"],
                str(r["n"]),
                fmt(r["tpr_at_1pct_fpr_before"]),
                matched,
                fmt(r["flagged_at_p_0.01"]),
                full,
                f"{fmt(cut.get('over_threshold'))} / {fmt(cut.get('flagged_at_p_0.01'))}",
                fmt(r["auroc_after"]),
                fmt(r["mean_score_before"]),
                fmt(r["mean_score_after"]),
            ]
        )
    header = [
        "run",
        "kept",
        "TPR@1%FPR original",
        "TPR@1%FPR at their lengths [95% CI]",
        "paraphrased at p <= 0.01",
        "TPR@1%FPR at the full-length threshold [95% CI]",
        "human at their lengths: over the full-length threshold / at p <= 0.01",
        "AUROC paraphrased",
    ]
    return [
        f"Near-copies excluded: only the paraphrases keeping less than {near_copy:g} of their original's token "
        "3-grams, so a method is not credited for text the paraphraser left alone (the same completions before "
        "paraphrasing in 'original'; mean detector score before and after). Paraphrases run shorter than the "
        "completions, so the figures that hold at their lengths come first: the TPR with its threshold at 1% FPR of "
        "the eval's human continuations cut to the kept paraphrases' lengths, and the fraction at p <= 0.01, which "
        "needs no threshold. The TPR at the threshold of human texts as long as the completions follows; it is not "
        "a rate at 1% FPR on shorter text, and it flatters a detector whose score is a per-token mean (an LLR), "
        "whose spread on human text widens as text gets shorter: 'human at their lengths' says how much of the cut "
        "human text that threshold (1% if length did not matter) and the p-value flag.",
        "",
        *md_table([*header, "mean score original", "mean score paraphrased"], cells),
    ]


def _with_ci(value: float | None, ci: list[float] | None) -> str:
    return "-" if value is None else f"{fmt(value)} [{ci[0]:.2f}, {ci[1]:.2f}]"


def _section(ev, cfg: ParaphraseConfig, n: int, summary: list[dict], quality: dict, runs: list[dict]) -> list[str]:
    decoding = f"top-p {cfg.top_p}, temperature {cfg.temperature}" if cfg.temperature > 0 else "greedy"
    beams = f", beam width {cfg.beams}" if cfg.beams > 1 else ""
    rows = [
        [
            gen,
            str(q["summary"]["n"]),
            fmt(q["summary"]["cosine_mean"]),
            fmt(q["summary"]["token_3gram_survival_mean"]),
            fmt(q["summary"]["word_3gram_survival_mean"]),
            fmt(q["summary"]["near_copy_fraction"]),
            fmt(q["summary"]["empty_fraction"]),
            fmt(q["summary"]["length_ratio_mean"], 2),
        ]
        for gen, q in quality.items()
    ]
    copies = max((q["summary"]["near_copy_fraction"] for q in quality.values()), default=0.0)
    lines = [
        f"`{cfg.paraphraser}` rewrote the first {n} watermarked completions of each generation set of `{ev.path}` "
        f"with the paper's request template ({cfg.prompt} instruction) through its chat template ({decoding}{beams}). "
        "Each method's unchanged detector scores the paraphrase with the original model; 'original' is the same "
        f"detector on the same completions before paraphrasing. {negatives_note(ev)} Cells: mean ± sd over seeds. "
        "This first table counts every paraphrase, near-copies included, at the threshold of full-length human text; "
        "compare methods by the second." + cost_note(ev, cfg.at_cost, runs),
        "",
        *compare_table(summary, "paraphrased"),
        "",
        *_real_table(runs, cfg.near_copy),
        "",
        "How real the attack is: cosine similarity of original and paraphrase under MiniLM "
        f"(`{cfg.embedder}`; the paper reports 0.92 with Qwen3-Embedding-8B); the fraction of the original's distinct "
        "3-grams found in the paraphrase, of the watermarked model's tokens and of lower-cased words; near-copies "
        f"keep at least {cfg.near_copy:g} of the token 3-grams; length ratio is paraphrase / original tokens.",
        "",
        *md_table(
            [
                "generations",
                "n",
                "cosine",
                "token 3-grams kept",
                "word 3-grams kept",
                "near-copies",
                "empty",
                "length ratio",
            ],
            rows,
        ),
    ]
    if copies > 0.2:
        hint = "a larger paraphraser" if cfg.prompt == "strong" else "`--prompt strong` or a larger paraphraser"
        lines += [
            "",
            f"**Warning:** up to {copies:.0%} of the paraphrases are near-copies of their input, so this run "
            f"understates what paraphrasing does; try {hint}.",
        ]
    return lines


def _write_samples(out: Path, prompts: list[str], originals: dict, paraphrases: dict, quality: dict) -> None:
    lines = []
    for gen, texts in originals.items():
        q = quality[gen]
        for i, (orig, para) in enumerate(zip(texts, paraphrases[gen], strict=True)):
            record = {
                "generations": gen,
                "index": i,
                "prompt": prompts[i],
                "original": orig,
                "paraphrase": para,
                "cosine": q["cosine"][i],
                "token_3gram_survival": q["token_3gram_survival"][i],
            }
            lines.append(json.dumps(record))
    atomic_write_text(out / "samples.jsonl", "\n".join(lines) + "\n")
