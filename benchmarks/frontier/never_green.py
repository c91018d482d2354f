"""Centring's side effect: how far a re-tied release moves the input embeddings of never-green rows, and what it costs.

    python benchmarks/frontier/never_green.py --key runs/fpr_product100/keys/k00 [--model smollm2-135m] [--n 40]

A centred key's offset is dW = delta (G - 1 c^T) S (``key/key.py``): on the head that only shifts every logit of a
position by the same constant, but in a re-tied release (``apply_watermark(model, key, "retie")``, what ``embed``
writes for a tied model) the same tensor is the input embedding. Rows in no green list (special tokens, padding:
``never_green``) then all move by the same vector -delta c^T S, where an uncentred key leaves them where they were.
The chat markers are such rows, and every chat turn reads them. This measures, on one default key:

* sizes: |dW row| / |U row| for each special token, against the median over the other rows;
* own perplexity (mean NLL of the continuation, ``model/perplexity.window_nll``) of four models: the base; the
  re-tied release; the release with the never-green rows of its input embeddings put back to U (untied: the head
  keeps U~ whole); an untied release (every input row U, the head U~). On ``--n`` chat conversations ("Tell me about
  <title>." and the article's opening as the answer, ``--answer-tokens`` tokens, then the end-of-turn marker, in the
  model's chat template) and on ``--n`` plain held-out windows of ``--prompt-tokens`` + ``--answer-tokens``, which
  hold no special token (a check: there the restored rows change nothing).

The change of each model against the base comes with a paired bootstrap interval over windows
(``perplexity.change``). Writes benchmarks/results/<name>.json atomically.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch  # noqa: E402
from common import heldout_windows, write_result  # noqa: E402

from openstamp import WatermarkKey, load_documents, load_model, split_documents  # noqa: E402
from openstamp.model.patch import apply_watermark, head, untie  # noqa: E402
from openstamp.model.perplexity import change, perplexity, window_nll  # noqa: E402
from openstamp.model.text import bos_prefix  # noqa: E402

MODELS = {
    "release": "re-tied release (what embed writes for a tied model)",
    "release, never-green inputs restored": "re-tied release, the never-green rows of its input embeddings back to U",
    "untied release": "head U~, every input embedding U",
}


def chat_windows(tokenizer, n: int, answer_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer) ids: the user's question in the chat template with the generation prompt, then a held-out
    Wikipedia article's opening and the end-of-turn marker."""
    end = tokenizer.eos_token_id
    docs = split_documents(load_documents("wikipedia"), "heldout")
    found = []
    for d in docs:
        question = f"Tell me about {d.id.split(':', 2)[-1]}."
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(rendered, add_special_tokens=False).input_ids
        answer = tokenizer(d.text, add_special_tokens=False).input_ids[:answer_tokens]
        if len(answer) == answer_tokens:
            found.append((prompt, answer + [end]))
        if len(found) == n:
            return found
    raise SystemExit(f"only {len(found)} held-out articles of {answer_tokens} tokens; lower --n")


def variants(base, key: WatermarkKey, spec: str) -> dict:
    release = copy.deepcopy(base)
    apply_watermark(release, key, "retie", source=spec)
    restored = copy.deepcopy(release)
    untie(restored)
    rows = torch.tensor(key.never_green, dtype=torch.long)
    with torch.no_grad():
        restored.get_input_embeddings().weight[rows] = base.get_input_embeddings().weight[rows]
    untied = copy.deepcopy(base)
    untie(untied)
    with torch.no_grad():
        head(untied).weight.copy_(head(release).weight)
    names = iter(MODELS)
    return {"base": base, next(names): release, next(names): restored, next(names): untied}


def sizes(base, key: WatermarkKey, tokenizer) -> dict:
    u = head(base).weight.detach().float()
    dw = key.delta_w()
    ratio = dw.norm(dim=1) / u.norm(dim=1).clamp_min(1e-12)
    never = set(key.never_green)
    others = torch.tensor([i for i in range(len(tokenizer)) if i not in never])
    special = sorted(i for i in tokenizer.all_special_ids if i in never)
    return {
        "never_green_rows": len(never),
        "median_ratio_other_rows": float(ratio[others].median()),
        "shift_norm": float(dw[special[0]].norm()) if special else None,
        "special": {tokenizer.convert_ids_to_tokens(i): float(ratio[i]) for i in special},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a tied chat model: alias, directory or hub id")
    parser.add_argument("--key", type=Path, required=True, help="a centred key (the default profile) for --model")
    parser.add_argument("--n", type=int, default=40, help="conversations (46 held-out articles), and plain windows")
    parser.add_argument("--prompt-tokens", type=int, default=50)
    parser.add_argument("--answer-tokens", type=int, default=96)
    parser.add_argument("--name", default="never_green", help="writes benchmarks/results/<name>.json")
    args = parser.parse_args()

    key = WatermarkKey.load(args.key)
    if key.centring is None:
        raise SystemExit(f"{args.key} is not a centred key: its never-green rows do not move")
    base, tokenizer = load_model(args.model)
    bos = bos_prefix(tokenizer)
    sets = {
        "chat": chat_windows(tokenizer, args.n, args.answer_tokens),
        "plain": [(bos + p, c) for p, c in heldout_windows(tokenizer, args.n, args.prompt_tokens, args.answer_tokens)],
    }
    models = variants(base, key, args.model)
    began = time.perf_counter()
    nll = {s: {m: window_nll(model, w) for m, model in models.items()} for s, w in sets.items()}
    rows = []
    for s, by_model in nll.items():
        for m, values in by_model.items():
            found = change(values, by_model["base"]) if m != "base" else None
            rows.append(
                {
                    "text": s,
                    "model": m,
                    "own_ppl": perplexity(values),
                    "change": None if found is None else found["change"],
                    "ci": None if found is None else list(found["ci"]),
                }
            )
            print(f"{s:6s} {m:38s} ppl {rows[-1]['own_ppl']:.3f}", flush=True)
    write_result(
        args.name,
        {
            "settings": {
                **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "key_id": key.key_id,
                "profile": key.meta.get("config", {}).get("profile"),
                "delta": key.delta,
                "models": MODELS,
                "chat": "user 'Tell me about <title>.' (chat template), answer: a held-out Wikipedia article's opening"
                " + the end-of-turn marker; NLL over the answer and the marker",
                "plain": "held-out news and Wikipedia windows (common.heldout_windows), NLL over the continuation",
            },
            "sizes": sizes(base, key, tokenizer),
            "rows": rows,
            "seconds": time.perf_counter() - began,
        },
    )


if __name__ == "__main__":
    main()
