"""Downstream accuracy through lm-eval: what a watermark costs on multiple-choice tasks.

Online, name real lm-eval tasks (``arc_challenge``, ``boolq``, ``hellaswag``). Offline, two local
tasks are built from the held-out halves of the packaged corpora (documents no key was built on)
and loaded by lm-eval as local JSON tasks:

* ``openstamp_cloze``: two sentences of a document, then the true next sentence among 4
  (3 distractors: other sentences of the same document, never adjacent to the context);
* ``openstamp_lastword``: 40 words of a passage, then the word that follows among 4 (3 other
  words of 4+ letters from the same document).

Each document gives up to 3 items of a task, at positions apart.

Both are scored by lm-eval's ``multiple_choice`` loglikelihood (``acc``). A weight-level method is
scored with its watermark applied to the model; a decode-time method's logits processor is applied
at every position of lm-eval's forward pass, as at generation (``processor(x_<=t, z_t)``). Per
task, the change against the original model is the paired difference of per-item accuracy, with a
normal 95% interval (mean +- 1.96 sd / sqrt(n)).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import torch

from openstamp.corpus import load_corpora, split_documents
from openstamp.storage import atomic_write_text

LOCAL_TASKS = ("openstamp_cloze", "openstamp_lastword")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")

_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def cloze_items(texts: list[str], n: int, rng: np.random.Generator) -> list[dict]:
    """At most ``n`` next-sentence items (up to 3 per document, contexts apart): two sentences, the next among 4."""
    items = []
    for text in texts:
        sentences = [s for s in _SENTENCE.split(" ".join(text.split())) if 20 <= len(s) <= 300]
        for i in range(2, len(sentences) - 1, max(4, len(sentences) // 3))[:3]:
            far = [s for j, s in enumerate(sentences) if j < i - 2 or j > i + 1]
            if len(far) < 3:
                break
            distractors = [far[j] for j in rng.choice(len(far), 3, replace=False)]
            items.append(_item(" ".join(sentences[i - 2 : i]), sentences[i], distractors, rng))
            if len(items) == n:
                return items
    return items


def lastword_items(texts: list[str], n: int, rng: np.random.Generator) -> list[dict]:
    """At most ``n`` last-word items (up to 3 per document): about 40 words, the true next word among 4."""
    items = []
    for text in texts:
        words = text.split()
        pool = sorted({w for w in (re.sub(r"\W+", "", w) for w in words) if len(w) >= 4 and w.isalpha()})
        for end in range(40, len(words), 60)[:3]:
            target = re.sub(r"\W+$", "", words[end])
            others = [w for w in pool if w != target]
            if len(target) < 4 or not target.isalpha() or len(others) < 3:
                continue
            distractors = [others[j] for j in rng.choice(len(others), 3, replace=False)]
            items.append(_item(" ".join(words[end - 40 : end]), target, distractors, rng))
            if len(items) == n:
                return items
    return items


def _item(context: str, answer: str, distractors: list[str], rng: np.random.Generator) -> dict:
    label = int(rng.integers(0, 4))
    choices = list(distractors)
    choices.insert(label, answer)
    return {"context": context, "choices": choices, "label": label}


def task_names(spec: tuple[str, ...]) -> tuple[str, ...]:
    """lm-eval task names, with ``local`` standing for both local tasks."""
    return tuple(dict.fromkeys(t for name in spec for t in (LOCAL_TASKS if name == "local" else (name,))))


def build_local_tasks(directory: Path, corpora: str, n: int, seed: int = 0) -> Path:
    """Write both local tasks (JSONL data and lm-eval YAML) under ``directory``; return it."""
    docs = split_documents(load_corpora(corpora), "heldout")
    texts = [docs[i].text for i in np.random.default_rng(seed).permutation(len(docs))]
    builders = {"openstamp_cloze": cloze_items, "openstamp_lastword": lastword_items}
    for task, build in builders.items():
        items = build(texts, n, np.random.default_rng(seed))
        if not items:
            raise ValueError(f"the held-out documents of {corpora} hold no {task} item; use a longer corpus")
        data = directory / f"{task}.jsonl"
        atomic_write_text(data, "".join(json.dumps(item) + "\n" for item in items))
        atomic_write_text(directory / f"{task}.yaml", _YAML.format(task=task, data=data.resolve()))
    return directory


@contextlib.contextmanager
def processed_logits(model, processor):
    """Apply a decode-time logits processor at every position of the model's forward passes."""
    if processor is None:
        yield
        return

    def hook(_module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        logits = output.logits.float()
        for t in range(logits.shape[1]):
            logits[:, t] = processor(ids[:, : t + 1], logits[:, t].clone())
        output.logits = logits
        return output

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def accuracy(model, tokenizer, tasks: tuple[str, ...], task_dir: Path | None, limit: int | None, batch: int) -> dict:
    """Per-item accuracy of each task: {task: [0/1, ...]} (the items in lm-eval's order)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch, device=str(next(model.parameters()).device))
    defaults = any(task not in LOCAL_TASKS for task in tasks)  # indexing lm-eval's own tasks takes a while
    manager = TaskManager(include_path=str(task_dir) if task_dir else None, include_defaults=defaults)
    with torch.inference_mode():
        result = lm_eval.simple_evaluate(
            model=lm, tasks=list(tasks), limit=limit, task_manager=manager, log_samples=True, bootstrap_iters=0
        )
    return {
        task: [float(s["acc"]) for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])] for task in tasks
    }


def change(acc: list[float], original: list[float]) -> dict:
    """Accuracy, its change against the original model's on the same items, and a paired 95% interval."""
    a, b = np.asarray(acc, dtype=np.float64), np.asarray(original, dtype=np.float64)
    diff = a - b
    half = 1.96 * diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    mean = float(diff.mean())
    return {"acc": float(a.mean()), "change": mean, "ci": (mean - half, mean + half), "n": len(a)}
