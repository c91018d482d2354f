"""Is this checkpoint a derivative of my release? ``verify_model`` under the lab's weight attacks, and its null.

    python benchmarks/provenance/weights_robustness.py [--model smollm2-135m --key DIR --out runs/verify_robustness]

One default key on the model (``--key``, else built on the key half of the packaged Wikipedia corpus) and its
re-tied release (``apply_watermark(..., "retie")``: lm_head and the input embeddings are one tensor, U~). Every
derivative below is made in memory with the lab's own attack code and tested with the product's ``verify_model``
against the original model as base; the table keeps p, the share of the offset found, and the p-value of each
matrix alone (lm_head; the input embeddings):

* fine-tuning (``lab.training``) on ``--train-windows`` windows of 128 tokens of the packaged news corpus (one
  epoch at batch 8): LoRA (lm_head among its targets; merged), full fine-tuning, instruction tuning (LoRA on
  ``lab.attacks.instruct``'s offline set), and the average of three full fine-tunes with different data orders
  (WASH-style);
* merges (``lab.attacks.merge.merge_models``) of the release with a full fine-tune of the *base* (one that never
  saw the mark): linear, SLERP, TIES and DARE-TIES (density 0.5), keeping 10%, 30%, 50% and 70% of the release;
* pruning at 50% (``lab.attacks.prune``), magnitude and Wanda, lm_head included;
* quantize-dequantize (``lab.attacks.quantizers``, run on lm_head and the input embeddings only: each tensor is
  quantized alone, so they come out as in the whole model) with lm_head quantized too (transformers' NF4, HQQ and quanto
  recipes keep lm_head in float, which the weights test reads exactly; the rows here are the harder case): NF4,
  HQQ 4-bit, quanto int4, GGUF Q4_K_M and Q2_K;
* head re-initialisation: lm_head untied and drawn afresh from N(0, initializer_range^2), alone and then trained
  (``lab.attacks.reinit.train_head``, ``--reinit-steps`` at batch 8 on the news windows, the backbone frozen); the
  input embeddings keep U~.

Nulls: the base itself, a LoRA and a full fine-tune of the base, and every derivative above against
``--secrets`` random secrets (the same S, another secret each: the null ``verify_model`` assumes), with the
permutation p-value (K = 9,999) of each; the FPR at alpha 0.01 and 0.001 is pooled over the derivatives listed in
``NULL_SET``, with Clopper-Pearson intervals, and per derivative. Every derivative's lm_head and input embeddings
are cached under ``--out``; a re-run resumes. ``--attacks`` picks families (a larger model on a CPU budget can skip
the fine-tunes; merges then take the base itself as partner). Writes benchmarks/results/<name>.json atomically.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import sys
import time
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch  # noqa: E402
from common import saved_key, write_result  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from openstamp import load_documents, load_model, split_documents  # noqa: E402
from openstamp.detect.rates import clopper_pearson  # noqa: E402
from openstamp.key.key import WatermarkKey  # noqa: E402
from openstamp.key.prf import permutations  # noqa: E402
from openstamp.model.patch import apply_watermark, head, is_tied, untie  # noqa: E402
from openstamp.provenance.readers import ModelWeights  # noqa: E402
from openstamp.provenance.verify import verify_model  # noqa: E402
from openstamp.provenance.weights import coefficients, permutation_pvalue, weights_test  # noqa: E402

KEEPS = (0.1, 0.3, 0.5, 0.7)  # fraction of the release a merge keeps
MERGES = ("linear", "slerp", "ties", "dare_ties")
QUANTIZERS = ("nf4", "hqq-4bit", "quanto-int4", "gguf-q4_k_m", "gguf-q2_k")
NULL_SET = (
    "base",
    "base-lora",
    "base-full",
    "lora",
    "full",
    "wash-3",
    "linear-0.5",
    "ties-0.3",
    "wanda-0.5",
    "gguf-q4_k_m",
    "reinit-head",
)
ALPHAS = (0.01, 0.001)


def secret_for(i: int, seed: int) -> bytes:
    return hashlib.sha256(f"openstamp/verify-null/{seed}/{i}".encode()).digest()


def matrices(model) -> dict[str, torch.Tensor]:
    """lm_head and the input embeddings, fp32 copies (one tensor under both names when tied)."""
    weight = head(model).weight
    copied = weight.detach().float().clone()
    if weight is model.get_input_embeddings().weight:
        return {"head": copied, "embed": copied}
    return {"head": copied, "embed": model.get_input_embeddings().weight.detach().float().clone()}


class Stored(Mapping):
    """A derivative's two matrices in its safetensors file, read when asked for: a 0.5B model's 30 derivatives hold
    about 1 GB each, more than memory."""

    def __init__(self, path: Path):
        self.path = path

    def __getitem__(self, name: str) -> torch.Tensor:
        with safe_open(self.path, framework="pt") as f:
            return f.get_tensor(name if name in f.keys() else "head")  # a tied derivative stores one matrix

    def __iter__(self):
        return iter(("head", "embed"))

    def __len__(self) -> int:
        return 2


class Derivatives:
    """Each derivative's two matrices, cached as safetensors under ``out/derivatives`` (``Stored``)."""

    def __init__(self, out: Path):
        self.dir = out / "derivatives"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.seconds: dict[str, float] = {}

    def get(self, name: str, make) -> Stored:
        path = self.dir / f"{name}.safetensors"
        if path.exists():
            return Stored(path)
        began = time.perf_counter()
        tensors = make()
        self.seconds[name] = time.perf_counter() - began
        partial = path.with_suffix(".partial")
        tied = tensors["head"] is tensors["embed"]
        save_file({k: v.contiguous() for k, v in tensors.items() if not (tied and k == "embed")}, partial)
        partial.replace(path)
        print(f"[derivative] {name} in {self.seconds[name]:.0f} s", flush=True)
        return Stored(path)


def train_copy(model, windows, mode: str, steps: int, seed: int, labels=None):
    """A fine-tuned copy of ``model`` (LoRA merged back); the lab's training loop."""
    from openstamp.lab.training import TrainConfig, prepare, train

    cfg = TrainConfig(mode=mode, steps=steps, every=steps, batch_size=8, seq_len=windows.shape[1], seed=seed)
    tuned = prepare(copy.deepcopy(model), cfg)
    train(tuned, windows, cfg, labels=labels, desc=f"{mode} seed {seed}", progress=False)
    return tuned.merge_and_unload() if mode == "lora" else tuned


def make_derivatives(args, base, tokenizer, release, key) -> dict[str, dict[str, torch.Tensor]]:
    from openstamp.lab.attacks.instruct import build_offline_set, instruction_batches
    from openstamp.lab.attacks.merge import merge_models
    from openstamp.lab.attacks.prune import PruneConfig, calibration_norms, prune_model
    from openstamp.lab.attacks.quantizers import SCHEMES, quantize_model
    from openstamp.lab.training import training_windows

    cache = Derivatives(args.out)
    news = split_documents(load_documents("news"), "key")
    windows = training_windows(tokenizer, news, 128)[: args.train_windows]
    steps = max(1, len(windows) // 8)  # one epoch at batch 8
    found = {"release": matrices(release), "base": matrices(base)}
    wanted = set(args.attacks.split(","))

    def trained(model, mode, seed=0, labels=None, data=None):
        return lambda: matrices(train_copy(model, windows if data is None else data, mode, steps, seed, labels))

    if "lora" in wanted:
        found["lora"] = cache.get("lora", trained(release, "lora"))
        found["base-lora"] = cache.get("base-lora", trained(base, "lora"))
    if "fine-tune" in wanted:
        for seed in range(3):
            found[f"full-s{seed}"] = cache.get(f"full-s{seed}", trained(release, "full", seed))
        found["full"] = found["full-s0"]
        found["wash-3"] = {
            m: torch.stack([found[f"full-s{s}"][m] for s in range(3)]).mean(0) for m in ("head", "embed")
        }
        rows = build_offline_set("wikipedia", len(windows), seed=0)
        ids, labels = instruction_batches(tokenizer, rows, 128)
        found["instruct"] = cache.get("instruct", trained(release, "lora", labels=labels, data=ids))

    partner, partner_dir = base, args.out / "models" / "base-full"
    if "fine-tune" in wanted:  # the merges' partner: a full fine-tune of the base, else the base itself
        if not (partner_dir / "config.json").exists():
            train_copy(base, windows, "full", steps, seed=7).save_pretrained(partner_dir)
        partner = type(base).from_pretrained(partner_dir, dtype=torch.float32).eval()
        found["base-full"] = matrices(partner)
    for how in MERGES if "merge" in wanted else ():
        for keep in KEEPS:

            def merge(how=how, keep=keep, partner=partner):
                merged = copy.deepcopy(release)
                merge_models(merged, partner, how, 1 - keep, base=base, density=0.5, seed=args.seed)
                return matrices(merged)

            found[f"{how}-{keep}"] = cache.get(f"{how}-{keep}", merge)

    for pruner in ("magnitude", "wanda") if "prune" in wanted else ():

        def prune(pruner=pruner):
            cfg = PruneConfig(pruner=pruner, sparsities=(0.5,), include_head=True)
            pruned = copy.deepcopy(release)
            norms = calibration_norms(pruned, tokenizer, cfg) if pruner == "wanda" else None
            prune_model(pruned, 0.5, cfg, norms)
            return matrices(pruned)

        found[f"{pruner}-0.5"] = cache.get(f"{pruner}-0.5", prune)
    for scheme in QUANTIZERS if "quantize" in wanted else ():
        if scheme not in SCHEMES:
            print(f"[derivative] {scheme}: this version's quantizers do not have it; skipped", flush=True)
            continue

        def quantize(scheme=scheme):
            quantized = copy.deepcopy(release)
            quantized.get_decoder().layers = torch.nn.ModuleList()  # the test reads only lm_head and embeddings:
            quantize_model(quantized, scheme, quantize_head=True)  # each is quantized alone, as in the full model
            return matrices(quantized)

        found[scheme] = cache.get(scheme, quantize)

    def reinit(train: bool = False):
        fresh = copy.deepcopy(release)
        untie(fresh)
        std = float(getattr(fresh.config.get_text_config(), "initializer_range", 0.02))
        generator = torch.Generator().manual_seed(args.seed)
        head(fresh).weight.data = torch.randn(head(fresh).weight.shape, generator=generator) * std
        if train:  # the lab's attack: the new head trained on the frozen release backbone's states
            from openstamp.lab.attacks.reinit import ReinitConfig, cached_hidden, install_head, train_head

            cfg = ReinitConfig(
                steps=args.reinit_steps, every=args.reinit_steps, seq_len=windows.shape[1], seed=args.seed
            )
            weight, history = train_head(cached_hidden(fresh, windows, 8), windows, head(fresh).weight.data, cfg)
            install_head(fresh, weight)
            print(f"[derivative] reinit-trained: training loss {history[-1]['train_loss']:.3f}", flush=True)
        return matrices(fresh)

    if "reinit" in wanted:
        found["reinit-head"] = cache.get("reinit-head", reinit)
        found["reinit-trained"] = cache.get("reinit-trained", lambda: reinit(train=True))
    return found


FAMILIES = {
    "release": "reference",
    "base": "null",
    "base-lora": "null",
    "base-full": "null",
    "lora": "fine-tune",
    "full": "fine-tune",
    "instruct": "fine-tune",
    "wash-3": "fine-tune",
    "reinit-head": "head re-init",
    "reinit-trained": "head re-init",
}


def family(name: str) -> str:
    if name in FAMILIES:
        return FAMILIES[name]
    if name.split("-")[0] in MERGES:
        return "merge"
    if name.split("-")[0] in ("magnitude", "wanda"):
        return "prune"
    return "quantize"


def weights_of(name: str, tensors: dict, tokens: list[str], architecture: str) -> ModelWeights:
    tied = torch.equal(tensors["head"], tensors["embed"])
    return ModelWeights(name, tensors["head"], tensors["embed"], tokens, architecture, tied)


def test_rows(found: dict, key: WatermarkKey, tokens: list[str], architecture: str) -> list[dict]:
    """verify_model on every derivative, and the p-value of each matrix alone."""
    base = weights_of("base", found["base"], tokens, architecture)
    rows_idx = torch.arange(key.vocab_size)
    rows = []
    for name, tensors in found.items():
        if name.startswith("full-s"):
            continue
        result = verify_model(weights_of(name, tensors, tokens, architecture), key, base)
        alone = {"head": weights_test([tensors["head"] - found["base"]["head"]], rows_idx, key, result.n_permutations)}
        same = torch.equal(tensors["head"], tensors["embed"]) and torch.equal(
            found["base"]["head"], found["base"]["embed"]
        )
        alone["embed"] = (
            alone["head"]  # a tied derivative: one matrix, tested once
            if same
            else weights_test([tensors["embed"] - found["base"]["embed"]], rows_idx, key, result.n_permutations)
        )
        keep = float(name.rsplit("-", 1)[1]) if family(name) == "merge" else None
        rows.append(
            {
                "derivative": name,
                "family": family(name),
                "release_kept": 1.0 if name == "release" else keep,
                "p_value": result.p_value,
                "share": result.share,
                "statistic": result.statistic,
                "p_head": alone["head"].p_value,
                "share_head": alone["head"].share,
                "p_embed": alone["embed"].p_value,
                "share_embed": alone["embed"].share,
                "warnings": result.warnings,
            }
        )
        print(f"{name:16s} p {result.p_value:.2e}  share {result.share:+.3f}", flush=True)
    return rows


def null_rows(found: dict, key: WatermarkKey, out: Path, n_secrets: int, seed: int, k: int = 9999) -> dict:
    """Permutation p-values of the derivatives in NULL_SET against ``n_secrets`` random secrets."""
    names = [n for n in NULL_SET if n in found]
    cached = out / f"null_{n_secrets}_{seed}_{k}.pt"
    if cached.exists() and torch.load(cached)["names"] == names:
        return torch.load(cached)["summary"]
    cs = torch.cat(
        [coefficients([found[n][m] - found["base"][m] for m in ("head", "embed")], key).float() for n in names], 1
    )  # (V, M L): C depends on S, not on the secret
    n_lists = key.n_lists
    p_values = torch.empty(n_secrets, len(names), dtype=torch.float64)
    began = time.perf_counter()
    for i in range(n_secrets):
        other = dataclasses.replace(key, secret=secret_for(i, seed))
        cross = (other.green.float().T @ cs).view(n_lists, len(names), n_lists)  # (L, M, L): G^T C_m
        perms = permutations(other.secret, n_lists, k)
        for m in range(len(names)):
            c = cross[:, m, :].double()
            p_values[i, m] = permutation_pvalue(c, other.delta * float(c.diagonal().sum()), other, k, perms)
        if (i + 1) % 100 == 0:
            print(f"[null] {i + 1}/{n_secrets} secrets in {time.perf_counter() - began:.0f} s", flush=True)
    summary = {"derivatives": names, "secrets": n_secrets, "permutations": k, "by_alpha": {}}
    for alpha in ALPHAS:
        hits = (p_values <= alpha).sum(0)
        total = int(hits.sum())
        summary["by_alpha"][str(alpha)] = {
            "flagged": total,
            "tests": n_secrets * len(names),
            "fpr": total / (n_secrets * len(names)),
            "ci": clopper_pearson(total, n_secrets * len(names)),
            "per_derivative": dict(zip(names, (int(h) for h in hits), strict=True)),
        }
    summary["seconds"] = time.perf_counter() - began
    torch.save({"names": names, "summary": summary, "p_values": p_values}, cached.with_suffix(".partial"))
    cached.with_suffix(".partial").replace(cached)
    return summary


def load_or_build_key(args, model, tokenizer) -> WatermarkKey:
    if args.key:
        return WatermarkKey.load(args.key)
    secret = hashlib.sha256(f"openstamp/verify-robustness/{args.seed}".encode()).digest()
    return saved_key(args.out / "key", model, tokenizer, model_spec=args.model, secret=secret, profile=args.profile)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--key", default=None, help="a saved key of the model (default: build one under --out)")
    parser.add_argument("--out", type=Path, default=Path("runs/verify_robustness"))
    parser.add_argument("--train-windows", type=int, default=400)
    parser.add_argument("--secrets", type=int, default=1000)
    parser.add_argument("--reinit-steps", type=int, default=100, help="steps that train the re-initialised head")
    parser.add_argument(
        "--attacks",
        default="lora,fine-tune,merge,prune,quantize,reinit",
        help="attack families (without fine-tune, merges take the base itself as partner)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="verify_robustness")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    began = time.perf_counter()
    base, tokenizer = load_model(args.model, dtype=torch.float32)
    base.eval()
    key = load_or_build_key(args, base, tokenizer)
    release = copy.deepcopy(base)
    apply_watermark(release, key, "retie")
    assert is_tied(release), "the default release of a tied model is re-tied"
    found = make_derivatives(args, base, tokenizer, release, key)
    tokens = tokenizer.convert_ids_to_tokens(list(range(key.vocab_size)))
    rows = test_rows(found, key, tokens, base.config.model_type)
    null = null_rows(found, key, args.out, args.secrets, args.seed)
    for alpha, entry in null["by_alpha"].items():
        print(f"[null] alpha {alpha}: {entry['flagged']}/{entry['tests']} = {entry['fpr']:.4f} {entry['ci']}")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_result(
        args.name,
        {
            "settings": settings,
            "key_id": key.key_id,
            "delta": key.delta,
            "tied_head": "retie",
            "merges": {
                "with": "a full fine-tune of the base (seed 7)" if "fine-tune" in args.attacks else "the base",
                "density": 0.5,
                "keeps": KEEPS,
            },
            "rows": rows,
            "null": null,
            "seconds": time.perf_counter() - began,
        },
    )


if __name__ == "__main__":
    main()
