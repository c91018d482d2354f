"""Radioactivity: was this model trained on my model's outputs? Pooled detection on a student's samples.

    python benchmarks/provenance/radioactivity.py --key runs/fpr_product100/keys/k00 [--model smollm2-135m]
        [--train-texts 256 --new-tokens 128 --epochs 2 --samples 128] [--mixes wm100,wm10,wm0] [--quick]
        [--name NAME] [--out DIR]

The teacher is the release as the product ships it: the base ``--model`` watermarked with ``--key`` (a
default-profile key built for that model) re-tied (``apply_watermark(model, key, "retie")``). Someone samples it
and fine-tunes the base on the text. Does the owner's detector find the mark in the student's own samples, and
after how many of its tokens?

* Training data: ``--train-texts`` windows of ``--prompt-tokens`` prompt + ``--new-tokens`` continuation from the
  key half of the packaged Wikipedia corpus; the teacher completes each prompt (float32, plain sampling at
  temperature 1, seed ``--seed``). Mixes, each over the same prompts: ``wm100`` (every continuation the
  teacher's), ``wm10`` (10% the teacher's, 90% the human continuation, chosen by a shuffle seeded with ``--seed``)
  and ``wm0`` (all human: the student never sees the mark, a null). ``--mixes`` trains some of them, and the
  teacher completes only the prompts those use (``--mixes wm10,wm0``: a tenth).
* Students: each mix fine-tunes a fresh copy of the unwatermarked base with LoRA (``openstamp.lab.training``:
  ``prepare`` + ``train``; the decoder's linear layers and lm_head, rank 16, adamw) for ``--epochs`` over its
  examples, batch ``--batch``, the loss on the continuation tokens only (the prompts are human text in every mix).
* Samples: each student (the peft model, adapter unmerged) completes ``--samples`` held-out prompts (the held-out
  half of the packaged news corpus: other documents than the training prompts') with ``--new-tokens`` tokens,
  seed ``--seed`` + 1. References on the same prompts and seed: the teacher itself (``--teacher-samples``, a
  positive) and the unfine-tuned base (a second null).
* Detection: the owner's ``Detector(release, tokenizer, key, DetectConfig(), base=original)``, i.e. the base's
  backbone beside the release, where the permutation p-value is exact (docs/detection.md, "Which backbone").
  ``detect_pool`` over each source's first k decoded completions (without their prompts) for k in ``--ks``, and
  with ``dedupe=True`` at the largest k: the pooled p-value against the tokens scored.

Every stage is cached under ``--out`` (default runs/<name>, git-ignored): the teacher's training completions,
each student's adapter and losses, each source's samples and its pooled rows; a re-run resumes. ``--quick``
(16 training texts, 8 samples of 24 tokens, 1 epoch) writes ``radioactivity_quick`` unless ``--name`` is given.
Writes benchmarks/results/<name>.json atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch  # noqa: E402
from common import claim_run, write_result  # noqa: E402

from openstamp import (  # noqa: E402
    DetectConfig,
    Detector,
    WatermarkKey,
    load_documents,
    load_model,
    split_documents,
)
from openstamp.lab.training import TrainConfig, lora_targets, prepare, train  # noqa: E402
from openstamp.model.generate import sample_completions  # noqa: E402
from openstamp.model.patch import apply_watermark  # noqa: E402
from openstamp.model.text import bos_prefix, prompt_windows  # noqa: E402
from openstamp.storage import atomic_directory, atomic_write_json, read_json  # noqa: E402

MIXES = {"wm100": 1.0, "wm10": 0.1, "wm0": 0.0}  # fraction of the training continuations that are the teacher's
REFERENCES = ("teacher", "base")
ROLES = {
    "wm100": "student: every training continuation the teacher's",
    "wm10": "student: 10% of the training continuations the teacher's, 90% human",
    "wm0": "student: every training continuation human (null: never saw the mark)",
    "teacher": "the watermarked release itself (positive reference)",
    "base": "the unfine-tuned base model (null reference)",
}
TRAIN_CORPUS, HELDOUT_CORPUS = ("wikipedia", "key"), ("news", "heldout")


def cached(path: Path, make, what: str):
    """``path``'s JSON, made by ``make()`` (and written atomically) if it is missing."""
    if not path.exists():
        atomic_write_json(path, make())
    return read_json(path, what)


def windows(tokenizer, corpus: tuple[str, str], args, n: int) -> list[tuple[list[int], list[int]]]:
    spec, part = corpus
    texts = [d.text for d in split_documents(load_documents(spec), part)]
    found = prompt_windows(tokenizer, texts, args.prompt_tokens, args.new_tokens, n)
    if len(found) < n:
        raise SystemExit(f"only {len(found)} windows of {args.prompt_tokens}+{args.new_tokens} tokens in {spec}/{part}")
    return found


def generate(model, tokenizer, prompts: list[list[int]], args, seed: int) -> dict:
    if not prompts:  # a run of wm0 alone needs no teacher text
        return {"ids": [], "texts": [], "seconds": 0.0, "seed": seed}
    began = time.perf_counter()
    ids = sample_completions(model, tokenizer, prompts, args.new_tokens, seed=seed, progress=False)
    seconds = time.perf_counter() - began
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return {"ids": ids, "texts": texts, "seconds": seconds, "seed": seed}


def teacher_rows(n: int, fraction: float, seed: int) -> list[int]:
    """Which of the n training windows get the teacher's continuation in a mix (a shuffle seeded with ``seed``)."""
    return sorted(random.Random(seed).sample(range(n), round(fraction * n)))


def mix_examples(train_windows, teacher: dict[int, list[int]], chosen: list[int], bos: list[int]):
    """(windows (N, T), labels with -100 on BOS and prompt, which rows are the teacher's): prompt + continuation,
    the teacher's (``teacher`` maps a row to its continuation of the row's prompt) on the ``chosen`` rows."""
    picked, rows, labels = set(chosen), [], []
    for i, (prompt, human) in enumerate(train_windows):
        ids = bos + prompt + (teacher[i] if i in picked else human)
        rows.append(ids)
        labels.append([-100] * (len(bos) + len(prompt)) + ids[len(bos) + len(prompt) :])
    if len({len(r) for r in rows}) != 1:
        raise SystemExit("training examples differ in length")  # prompt_windows and sample_completions fix both
    return torch.tensor(rows), torch.tensor(labels), chosen


def train_config(args, n: int, seq_len: int) -> TrainConfig:
    steps = math.ceil(args.epochs * n / args.batch)
    return TrainConfig(
        mode="lora",
        steps=steps,
        every=steps,
        batch_size=args.batch,
        seq_len=seq_len,
        lr=args.lr,
        optimizer="adamw",
        warmup_fraction=0.1,
        seed=args.seed,
    )


def student(args, mix: str, examples, cfg: TrainConfig):
    """The mix's student: LoRA on a fresh base, trained (its adapter and losses cached) or loaded back."""
    from peft import PeftModel

    folder = args.out / "students" / mix
    model, _ = load_model(args.model)
    if (folder / "train.json").exists():
        return PeftModel.from_pretrained(model, folder / "adapter").eval(), read_json(folder / "train.json", "losses")
    windows_, labels, chosen = examples
    torch.manual_seed(args.seed)  # LoRA's initialisation
    model = prepare(model, cfg)
    began = time.perf_counter()
    losses = train(model, windows_, cfg, labels=labels, progress=False)
    seconds = time.perf_counter() - began
    with atomic_directory(folder / "adapter", overwrite=True) as tmp:
        model.save_pretrained(tmp, save_embedding_layers=False)  # the LoRA weights only; the base is unchanged
    k = max(1, len(losses) // 10)
    record = {
        "examples": len(windows_),
        "teacher_examples": len(chosen),
        "teacher_rows": chosen,
        "steps": cfg.steps,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "loss_first_10pct": sum(losses[:k]) / k,
        "loss_last_10pct": sum(losses[-k:]) / k,
        "losses": losses,
        "seconds": seconds,
    }
    atomic_write_json(folder / "train.json", record)
    print(
        f"[train] {mix}: {cfg.steps} steps in {seconds:.0f} s, loss {record['loss_first_10pct']:.3f} -> "
        f"{record['loss_last_10pct']:.3f} ({len(chosen)}/{len(windows_)} teacher examples)",
        flush=True,
    )
    return model.eval(), record


def pool_rows(detector, texts: list[str], ks: list[int]) -> dict:
    def row(k: int, dedupe: bool = False) -> dict:
        r = detector.detect_pool(texts[:k], dedupe=dedupe)
        kept = ("permutation_p", "tail_p", "permutation_z", "centred_llr", "green_fraction", "binomial_p")
        return {
            "k": k,
            "n_tokens": r.n_tokens,
            "p_value": r.p_value,
            "status": r.status,
            "backbone": r.backbone,
            **{name: r.detectors[name] for name in (*kept, "dedupe_dropped") if name in r.detectors},
        }

    began = time.perf_counter()
    rows = [row(k) for k in ks]
    return {"rows": rows, "dedupe": row(ks[-1], dedupe=True), "seconds": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="the base model: alias, directory or hub id")
    parser.add_argument("--key", type=Path, required=True, help="the release's key (default profile, --model's)")
    parser.add_argument("--train-texts", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--samples", type=int, default=128, help="held-out completions per student (and the base)")
    parser.add_argument("--teacher-samples", type=int, default=16, help="held-out completions of the teacher")
    parser.add_argument("--ks", default="1,2,4,8,16,32,64,128", help="texts pooled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mixes",
        default=",".join(MIXES),
        help=f"the students to train, of {', '.join(MIXES)} (the teacher samples only the prompts their mixes use)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 16 texts, 8 samples of 24 tokens, 1 epoch")
    parser.add_argument("--name", default="radioactivity", help="writes benchmarks/results/<name>.json")
    parser.add_argument("--out", type=Path, default=None, help="the cache (default runs/<name>)")
    args = parser.parse_args()
    if args.quick:
        args.train_texts, args.samples, args.teacher_samples, args.new_tokens, args.epochs = 16, 8, 4, 24, 1
    if args.quick and args.name == "radioactivity":  # a smoke run never overwrites the real result
        args.name = "radioactivity_quick"
    args.out = args.out or Path("runs") / args.name
    mixes = [m for m in args.mixes.split(",") if m]
    if not mixes or any(m not in MIXES for m in mixes):
        parser.error(f"--mixes takes names of {', '.join(MIXES)}, not {args.mixes!r}")
    sources = (*mixes, *REFERENCES)
    ks = sorted({int(k) for k in args.ks.split(",") if k})
    ks = [k for k in ks if k <= args.samples]
    if not ks:
        raise SystemExit("no k in --ks is at most --samples")
    teacher_ks = [k for k in ks if k <= args.teacher_samples] or ks[:1]
    args.teacher_samples = max(args.teacher_samples, teacher_ks[-1])

    settings = claim_run(args.out, {**vars(args), "ks": ks, "teacher_ks": teacher_ks}, free=("name", "out"))
    started = time.perf_counter()

    key = WatermarkKey.load(args.key)
    base, tokenizer = load_model(args.model)
    teacher, _ = load_model(args.model)
    apply_watermark(teacher, key, "retie", source=args.model)  # the release as openstamp embed writes it
    bos = bos_prefix(tokenizer)
    train_windows = windows(tokenizer, TRAIN_CORPUS, args, args.train_texts)
    heldout = [p for p, _ in windows(tokenizer, HELDOUT_CORPUS, args, args.samples)]

    began = time.perf_counter()
    chosen = {m: teacher_rows(len(train_windows), MIXES[m], args.seed) for m in mixes}
    needed = sorted({i for rows in chosen.values() for i in rows})
    teacher_train = cached(
        args.out / "teacher_train.json",
        lambda: {
            "rows": needed,
            **generate(teacher, tokenizer, [train_windows[i][0] for i in needed], args, args.seed),
        },
        "teacher completions",
    )
    teacher_ids = dict(zip(teacher_train["rows"], teacher_train["ids"], strict=True))
    print(f"[data] {len(needed)} teacher completions ({time.perf_counter() - began:.0f} s)", flush=True)

    seq_len = len(bos) + args.prompt_tokens + args.new_tokens
    cfg = train_config(args, len(train_windows), seq_len)
    found: dict = {}
    for mix in mixes:
        path = args.out / "samples" / f"{mix}.json"
        record = None
        if not path.exists():
            examples = mix_examples(train_windows, teacher_ids, chosen[mix], bos)
            model, record = student(args, mix, examples, cfg)
            cached(path, lambda model=model: generate(model, tokenizer, heldout, args, args.seed + 1), "samples")
            del model
        record = record or read_json(args.out / "students" / mix / "train.json", "losses")
        found[mix] = {"training": {k: v for k, v in record.items() if k != "losses"}, "losses": record["losses"]}
    refs = {"teacher": (teacher, heldout[: args.teacher_samples]), "base": (base, heldout)}
    for name, (model, prompts) in refs.items():
        cached(
            args.out / "samples" / f"{name}.json",
            lambda model=model, prompts=prompts: generate(model, tokenizer, prompts, args, args.seed + 1),
            "samples",
        )
    print(f"[samples] done ({time.perf_counter() - started:.0f} s so far)", flush=True)

    detector = Detector(teacher, tokenizer, key, DetectConfig(), base=base)
    for name in sources:
        samples = read_json(args.out / "samples" / f"{name}.json", "samples")
        texts, name_ks = samples["texts"], teacher_ks if name == "teacher" else ks
        pooled = cached(
            args.out / "pool" / f"{name}.json", lambda t=texts, k=name_ks: pool_rows(detector, t, k), "pooled rows"
        )
        found.setdefault(name, {}).update(
            {
                "role": ROLES[name],
                "n_samples": len(samples["texts"]),
                "sampling_seconds": samples["seconds"],
                "rows": pooled["rows"],
                "dedupe": pooled["dedupe"],
                "detect_seconds": pooled["seconds"],
            }
        )
        print(f"[detect] {name}: {len(pooled['rows'])} pooled sets ({pooled['seconds']:.0f} s)", flush=True)

    results = {name: {k: v for k, v in found[name].items() if k != "losses"} for name in sources}
    for mix in mixes:
        results[mix]["training"]["losses"] = found[mix]["losses"]
    write_result(
        args.name,
        {
            "settings": {
                **settings,
                "key_id": key.key_id,
                "profile": key.meta.get("config", {}).get("profile"),
                "key_model": key.meta.get("model", {}),
                "gamma": key.gamma,
                "delta": key.delta,
                "n_lists": key.n_lists,
                "release": "base watermarked with the key, tied head re-tied (apply_watermark 'retie')",
                "train_prompts": "{} ({} half), {}-token windows".format(*TRAIN_CORPUS, args.prompt_tokens),
                "heldout_prompts": "{} ({} half), {}-token windows".format(*HELDOUT_CORPUS, args.prompt_tokens),
                "sampling": {
                    "dtype": "float32",
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "train_seed": args.seed,
                    "sample_seed": args.seed + 1,
                },
                "mixes": {m: MIXES[m] for m in mixes},
                "train_config": dataclasses.asdict(cfg),
                "lora_targets": lora_targets(base),
                "loss_on": "continuation tokens only (labels -100 on the prompt)",
                "student_generation": "peft model, adapter unmerged",
                "detect_config": dataclasses.asdict(DetectConfig()),
                "scored": "each sample's decoded completion, without its prompt",
            },
            "question": "radioactivity: is the watermark found in the samples of a model fine-tuned on the release's "
            "outputs (pooled p-value against the tokens scored)?",
            "backbone": detector.backbone,
            "sources": results,
            "wall_seconds": time.perf_counter() - started,
            "method": __doc__.strip().splitlines()[0],
        },
    )
    summary(results)


def summary(results: dict) -> None:
    ks = sorted({r["k"] for s in results.values() for r in s["rows"]})
    print("\npooled p-value by texts pooled (tokens scored)")
    print(f"{'source':8s} " + " ".join(f"{f'k={k}':>17s}" for k in ks) + f" {'dedupe':>17s}")
    for name, s in results.items():
        by_k = {r["k"]: r for r in s["rows"]}
        cells = [cell(by_k.get(k)) for k in ks] + [cell(s["dedupe"])]
        print(f"{name:8s} " + " ".join(f"{c:>17s}" for c in cells))


def cell(row: dict | None) -> str:
    if row is None:
        return "-"
    p = "-" if row["p_value"] is None else f"{row['p_value']:.1e}"
    return f"{p} ({row['n_tokens']})"


if __name__ == "__main__":
    main()
