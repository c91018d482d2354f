"""Instruction fine-tuning: turn the watermarked base model into a chat model, then detect.

The most common thing done to an open base model. Examples are (instruction, input, output)
rows (alpaca) or {"messages": [...]} conversations. Each becomes prompt + response tokens: the
tokenizer's chat template when it has one, else "### Instruction:\\n...\\n\\n### Response:\\n".
The loss is taken on the response tokens only (labels -100 on the prompt and the padding).
Training is the shared loop of openstamp.lab.training (LoRA or full), with detection of the eval
prompts' completions at every checkpoint, as in the fine-tuning attack.

Data: ``data`` is a local .jsonl file, ``hf:NAME[:CONFIG][:SPLIT]`` (a datasets name or a
local dataset folder, e.g. hf:tatsu-lab/alpaca), or None: a small offline set built from the
packaged corpora (continue a passage, give a title, repeat the first sentence).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from openstamp.config import check, option
from openstamp.corpus import load_corpora, split_documents
from openstamp.errors import CorpusError, require_extra
from openstamp.lab.attacks.common import (
    AT_COST_HELP,
    DETECTION,
    by_method,
    cached_json,
    check_at_cost,
    config_dict,
    cost_note,
    file_name,
    open_eval,
    prepare_out,
)
from openstamp.lab.attacks.finetune import attack_run, checkpoint_rows, durability_plot, step_table
from openstamp.lab.attacks.report import DETECTION_TABLES, negatives_note, publish, titled_tables
from openstamp.lab.attacks.weights import weight_runs
from openstamp.lab.training import TrainConfig
from openstamp.model.load import load_model
from openstamp.model.text import bos_prefix
from openstamp.storage import read_json

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class InstructConfig(TrainConfig):
    """The shared training settings plus the instruction data."""

    data: str | None = option(None, "local .jsonl (alpaca or messages rows), hf:NAME[:CONFIG][:SPLIT], or None")
    corpora: str = option("news,wikipedia", "packaged corpora the offline set is built from when data is None")
    examples: int = option(256, "at most this many examples are built (offline set) or read from data")
    at_cost: float | None = option(None, AT_COST_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.mode in ("lora", "full"), "instruction tuning mode must be lora or full")
        check(self.examples >= 1, "examples must be >= 1")
        check_at_cost(self.at_cost)


def build_offline_set(corpora: str, count: int, seed: int = 0) -> list[dict]:
    """At most ``count`` alpaca rows from the key half of the corpora, one per document, cycling through
    three tasks: continue a passage, give a title (a Wikipedia page's own), repeat the first sentence."""
    docs = split_documents(load_corpora(corpora), "key")
    rng = np.random.default_rng(seed)
    rows = []
    for index in rng.permutation(len(docs))[:count]:
        text = " ".join(docs[index].text.split())
        words = text.split()
        first = text.split(". ")[0].rstrip(".") + "."
        tasks = (
            ("Continue this passage:", " ".join(words[:30]), " ".join(words[30:60])),
            ("Give a short title for this text.", " ".join(words[:50]), _title(docs[index].id, words)),
            ("Repeat the first sentence of this text.", " ".join(words[:50]), first),
        )
        instruction, given, answer = tasks[len(rows) % 3]
        rows.append({"instruction": instruction, "input": given, "output": answer})
    return rows


def _title(doc_id: str, words: list[str]) -> str:
    """A packaged Wikipedia page's own title (its id is wikipedia:PAGE:TITLE), else the first six words."""
    return doc_id.split(":", 2)[2] if doc_id.startswith("wikipedia:") else " ".join(words[:6]).title()


def read_examples(spec: str, limit: int) -> list[dict]:
    """Rows of a local .jsonl file or an hf: dataset, each checked to be alpaca or messages shaped."""
    if spec.startswith("hf:"):
        rows = _hf_rows(spec[3:])
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"instruction data {path} does not exist (a .jsonl file or hf:NAME)")
        rows = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise CorpusError(f"{path}:{i + 1} is not valid JSON: {err}") from err
    if not rows:
        raise CorpusError(f"instruction data {spec} holds no rows")
    for i, row in enumerate(rows):
        ok = isinstance(row, dict) and (
            isinstance(row.get("messages"), list) or (isinstance(row.get("instruction"), str) and "output" in row)
        )
        if not ok:
            raise CorpusError(f"row {i + 1} of {spec} has neither 'messages' nor 'instruction' and 'output'")
    return rows[:limit]


def _hf_rows(spec: str) -> list[dict]:
    require_extra("datasets", "corpora", "an hf: instruction set")
    import datasets

    name, *rest = spec.split(":")
    config, split = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0] if rest else "train")
    try:
        if Path(name).is_dir() and (Path(name) / "dataset_dict.json").exists():
            data = datasets.load_from_disk(name)[split]
        elif Path(name).is_dir() and (Path(name) / "dataset_info.json").exists():
            data = datasets.load_from_disk(name)
        else:
            data = datasets.load_dataset(name, config, split=split)
    except Exception as err:  # datasets raises many types: no hub access, bad split, ...
        raise CorpusError(f"could not load instruction dataset {name!r} (split {split}): {err}") from err
    return [dict(row) for row in data]


def as_messages(row: dict) -> list[dict]:
    """A row as chat messages: alpaca rows become one user turn and one assistant turn."""
    if "messages" in row:
        return row["messages"]
    prompt = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": str(row["output"])}]


def encode_example(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a conversation whose last message is the assistant's answer."""
    context, answer = messages[:-1], messages[-1]["content"]
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(context, tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    else:
        text = "\n\n".join(m["content"] for m in context)
        prompt_ids = (
            bos_prefix(tokenizer)
            + tokenizer(f"### Instruction:\n{text}\n\n### Response:\n", add_special_tokens=False).input_ids
        )
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return prompt_ids, tokenizer(answer, add_special_tokens=False).input_ids + eos


def instruction_batches(tokenizer: PreTrainedTokenizerBase, rows: list[dict], seq_len: int) -> tuple:
    """Right-padded ids (N, seq_len) and labels (N, seq_len): -100 except on response tokens.

    An example longer than the window keeps at most seq_len // 2 response tokens and the end of
    its prompt (left truncation).
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), seq_len), pad, dtype=torch.long)
    labels = torch.full((len(rows), seq_len), -100, dtype=torch.long)
    kept = 0
    for row in rows:
        prompt, response = encode_example(tokenizer, as_messages(row))
        if len(prompt) + len(response) > seq_len:  # keep at most half a window of response, then the prompt's end
            response = response[: max(seq_len // 2, seq_len - len(prompt))]
            prompt = prompt[len(prompt) + len(response) - seq_len :]
        sequence = prompt + response
        if not response:
            continue
        ids[kept, : len(sequence)] = torch.tensor(sequence)
        labels[kept, len(prompt) : len(sequence)] = torch.tensor(sequence[len(prompt) :])
        kept += 1
    if kept == 0:
        raise ValueError("no example has a response")
    return ids[:kept], labels[:kept]


def run_instruct(eval_dir: Path, out: Path, cfg: InstructConfig, progress: bool = True) -> dict:
    """Instruction-tune each weight-level run's watermarked model; detect at every checkpoint."""
    ev = open_eval(eval_dir)
    given = None if cfg.data is None else read_examples(cfg.data, cfg.examples)  # bad data fails before any work
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    runs, skipped = weight_runs(ev, cfg.methods, cfg.at_cost)
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    n = min(cfg.n, len(ev.windows))
    rows = given or cached_json(
        out / "data" / "instructions.json", build_offline_set, cfg.corpora, cfg.examples, cfg.seed
    )
    data = instruction_batches(tokenizer, rows, cfg.seq_len)
    results_rows = []
    for run in runs:
        losses_path = out / "losses" / f"{file_name(run['run'])}.json"
        cached_json(losses_path, attack_run, ev, run, base, tokenizer, data, n, cfg, out, progress)
        results_rows += checkpoint_rows(ev, run, out, cfg, n, read_json(losses_path, "loss record"))
    summary = by_method(results_rows, (*DETECTION, "mean_score", "train_loss"), extra=("step",))
    plot = durability_plot(summary, cfg, out / "instruct_tpr.png")
    templated = bool(getattr(tokenizer, "chat_template", None))
    results = {
        "settings": config_dict(cfg),
        "eval": str(ev.path),
        "n": n,
        "examples": len(data[0]),
        "response_tokens": int((data[1] != -100).sum()),
        "chat_template": templated,
        "skipped": skipped,
        "runs": results_rows,
        "summary": summary,
    }
    publish(
        out, "instruct", f"instruction fine-tuning ({cfg.mode})", _section(ev, cfg, results), [plot], results, ev.path
    )
    return results


def _section(ev, cfg: InstructConfig, results: dict) -> list[str]:
    source = (
        f"`{cfg.data}`"
        if cfg.data
        else f"an offline set built from `{cfg.corpora}` (continue / title / first sentence)"
    )
    what = f"LoRA (rank {cfg.lora_r}, alpha {cfg.lora_alpha})" if cfg.mode == "lora" else "full fine-tuning"
    form = "the tokenizer's chat template" if results["chat_template"] else "a '### Instruction / ### Response' format"
    steps, summary = cfg.checkpoints(), results["summary"]
    lines = [
        f"Each weight-level watermarked model of `{ev.path}` was instruction-tuned with {what} on {source}: "
        f"{results['examples']} examples in {form}, loss on the {results['response_tokens']:,} response tokens only, "
        f"{cfg.optimizer} at peak learning rate {cfg.lr:g}, batch {cfg.batch_size} x {cfg.seq_len}, {cfg.steps} steps. "
        f"At each checkpoint the model completed the first {results['n']} eval prompts and each method's unchanged "
        f"detector scored them with the original model; step 0 is the eval's own completions. {negatives_note(ev)} "
        "Cells: mean ± sd over seeds." + cost_note(ev, cfg.at_cost, results["runs"]),
        *titled_tables(
            lambda metric: step_table(summary, steps, metric),
            (
                *DETECTION_TABLES,
                ("Mean detector score:", "mean_score"),
                ("Training loss (response tokens):", "train_loss"),
            ),
        ),
    ]
    if results["skipped"]:
        lines += ["", f"Skipped: {', '.join(results['skipped'])} (decode-time watermarks are not in the weights)."]
    return lines
