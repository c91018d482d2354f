"""What helps at low strength? Fewer green lists and a shrunk selector, at one delta, against the key.

    python benchmarks/low_strength.py [--key runs/tune/key] [--deltas 0.5] [--n 64] [--tokens 64]
        [--variants 64:0,16:0,254:0.1,254:1] [--name low_strength]

A weak watermark (delta where the model's own perplexity rises ~10%) is detected in only part
of the 64-token texts. Two knobs of S might buy detection at the same cost:

* fewer lists L: each list is chosen more often and more surely (selector accuracy rises);
* selector shrinkage (``selector.shrinkage``): ridge lambda = f * tr(Z^T Z) / d (f the fraction of the mean
  diagonal, over the fitted states), pulling S toward smaller, smoother selections before the rows are rescaled.
  The results kept before the option existed took the diagonal over every training state, the dropped clusters'
  too.

For every variant S is refitted (k-means, ridge, rescaling, as key building does) on the same
states, sampled as the key's were, with the key's secret, P, gamma and delta; then one probe
(as ``openstamp tune`` runs) watermarks the model, samples one completion per held-out prompt,
flags at p <= 0.01 and measures the own perplexity on the prompts' human continuations.
Every variant (and the key's own S) runs at every delta of ``--deltas``. Writes
benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools

from common import add_key_arguments, key_and_prompts, write_result

from openstamp.analysis.lists import key_states
from openstamp.key.selector import fit_selector
from openstamp.patch import release_tied_head
from openstamp.tune import TuneConfig, own_perplexity, probe


def variants(text: str) -> list[tuple[int, float]]:
    """``"64:0,254:1"`` -> [(64, 0.0), (254, 1.0)]: (L, shrinkage f) refitted beside the key's own S."""
    try:
        return [(int(lists), float(f)) for lists, f in (v.split(":") for v in text.split(",") if v)]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"variants are L:f pairs separated by commas, not {text!r}") from err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_key_arguments(parser, (0.5,))
    parser.add_argument(
        "--variants",
        type=variants,
        default=variants("64:0,16:0,254:0.1,254:1"),
        help="L:f pairs refitted beside the key's own S (the key's setting is L 254 with f ~ 0)",
    )
    parser.add_argument("--name", default="low_strength", help="writes benchmarks/results/<name>.json")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--states", type=int, default=24576)
    args = parser.parse_args()
    cfg = TuneConfig(tokens=args.tokens, n=args.n, fpr=0.01)
    key, model, tokenizer, pairs = key_and_prompts(args, cfg)
    original = own_perplexity(model, tokenizer, pairs, cfg.batch_size)
    tied_head = release_tied_head(key)
    z_train, z_held, _, selector = key_states(model, tokenizer, key, args.corpus, args.states)
    rows = []
    fits = {None: (key.selector, key.meta.get("stats", {}).get("selector", {}))}
    for n_lists, shrink in args.variants:
        fits[(n_lists, shrink)] = fit_selector(
            z_train, z_held, dataclasses.replace(selector, n_lists=n_lists, shrinkage=shrink)
        )
    for (name, (S, stats)), delta in itertools.product(fits.items(), args.deltas):
        variant = dataclasses.replace(key, selector=S, delta=delta, meta=copy.deepcopy(key.meta))
        row = probe(model, tokenizer, variant, pairs, cfg, tied_head, progress=True)
        row.update(
            variant="the key's own S" if name is None else f"L {name[0]}, shrinkage {name[1]:g}",
            lists=int(S.shape[0]),
            shrinkage=None if name is None else name[1],
            selector_heldout_accuracy=stats.get("heldout_accuracy"),
            ridge_lambda=stats.get("ridge_lambda"),
            own_ppl_change=row["own_ppl"] / original - 1,
        )
        rows.append(row)
        print(
            f"{row['variant']:24s} delta {delta:g}  TPR {row['tpr']:.3f}  own ppl {100 * row['own_ppl_change']:+.1f}%",
            flush=True,
        )
    write_result(
        args.name,
        {
            "model": args.model,
            "key": args.key,
            "key_id": key.key_id,
            "corpus": args.corpus,
            "deltas": args.deltas,
            "settings": dataclasses.asdict(cfg),
            "states": {"train": len(z_train), "heldout": len(z_held)},
            "own_ppl_original": original,
            "rows": rows,
        },
    )
    print(f"\n{args.tokens}-token texts, n {args.n}, flagged at p <= 0.01")
    print(f"{'variant':26s}{'delta':>6s}{'L':>5s}{'S held-out acc':>16s}{'TPR':>7s}{'95% CI':>15s}{'own ppl':>10s}")
    for r in rows:
        acc = r["selector_heldout_accuracy"]
        acc_text = "-" if acc is None else f"{acc:.3f}"
        low, high = r["tpr_ci"]
        print(f"{r['variant']:26s}{r['delta']:6g}{r['lists']:5d}{acc_text:>16s}{r['tpr']:7.3f}"
              f"    [{low:.2f}, {high:.2f}]{100 * r['own_ppl_change']:+9.1f}%")  # fmt: skip


if __name__ == "__main__":
    main()
