"""Tiny, deterministic models and corpora: every unit test runs offline in seconds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from tokenizers import decoders as tk_decoders
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from typer.testing import CliRunner

from openstamp.config import load_profile

WORDS = (
    "the river city council voted on a new plan for public parks and schools while farmers "
    "reported rain across the northern valley markets rose as investors watched energy prices "
    "scientists measured the glacier and found it shrinking faster than expected the museum "
    "opened an exhibit about ancient trade routes and coastal villages"
).split()


@pytest.fixture(scope="session", autouse=True)
def no_shared_eval_store():
    """`openstamp eval` shares keys and generations through a store in the user's cache by default; tests keep
    nothing there (a test that wants a store names its own folder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENSTAMP_EVAL_STORE", "none")
        yield


@pytest.fixture
def benchmark(monkeypatch):
    """Import a script of benchmarks/ by its path there ("fpr/calibrated_fpr"), with benchmarks/ (common.py) and its
    own folder on sys.path for this test only, as the script sees them when run from the repository root."""
    import importlib

    root = Path(__file__).parent.parent / "benchmarks"

    def load(path: str):
        folder, _, name = path.rpartition("/")
        monkeypatch.syspath_prepend(str(root))
        if folder:
            monkeypatch.syspath_prepend(str(root / folder))
        return importlib.import_module(name)

    return load


def make_corpus(n_docs: int = 40, words_per_doc: int = 220, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        words = [rng.choice(WORDS) for _ in range(words_per_doc)]
        docs.append(" ".join(words).capitalize() + ".")
    return docs


def make_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk_decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_corpus(20, 100, seed=1), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )


def make_model(
    tied: bool, vocab_size: int, hidden: int = 32, seed: int = 0, config_class=LlamaConfig, model_class=LlamaForCausalLM
) -> LlamaForCausalLM:
    """A tiny random causal LM (a Llama unless another config and model class are given)."""
    torch.manual_seed(seed)
    config = config_class(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = model_class(config)
    with torch.no_grad():  # larger-than-default weights give peakier, more realistic next-token distributions
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(300)


@pytest.fixture(scope="session", params=["tied", "untied"])
def tiny_model_dir(request, tmp_path_factory, tokenizer) -> Path:
    """A saved tiny Llama (tied and untied) with its tokenizer: a normal HF directory."""
    return save_tiny(tmp_path_factory.mktemp(f"tiny-{request.param}"), tokenizer, tied=request.param == "tied")


def save_tiny(path: Path, tokenizer, *, tied: bool) -> Path:
    """A tiny Llama and ``tokenizer`` saved in ``path``; vocab rows beyond the tokenizer exercise the padding-row
    rule."""
    make_model(tied, vocab_size=len(tokenizer) + 12).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in make_corpus()) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_config():
    """Small settings for the tiny model; P = I so unit tests need no sentence embedder."""
    return load_profile("small").with_overrides(
        {
            "states.n_states": 512,
            "states.window_tokens": 96,
            "states.positions_per_window": 32,
            "states.context_tokens": 16,
            "projection.enabled": False,
            "selector.n_lists": 8,
            "selector.min_cluster_size": 5,
        }
    )


# `openstamp embed` flags that suit the tiny model: no projection, 6 lists, few states
SMALL_EMBED = [
    "--profile",
    "small",
    "--no-projection",
    "--lists",
    "6",
    "--set",
    "states.n_states=256",
    "--set",
    "states.window_tokens=96",
    "--set",
    "selector.min_cluster_size=5",
    "--quiet",
]


def fixed_secret(root: Path, fill: int) -> list[str]:
    """``embed`` options for a fixed secret written under ``root``: a fixture's key is then the same on every run,
    and no detection bar of a test rides on a random draw."""
    (root / "secret").write_bytes(bytes([fill]) * 32)
    return ["--secret-file", str(root / "secret")]


@pytest.fixture(scope="module")
def release(tiny_model_dir, corpus_file, tmp_path_factory) -> Path:
    """A tiny watermarked release (model/) and its key (key/), built through the CLI; one per test module."""
    from openstamp.cli import app

    root = tmp_path_factory.mktemp("release")
    args = [
        "embed",
        "--model",
        str(tiny_model_dir),
        "--corpus",
        str(corpus_file),
        "--out",
        str(root / "model"),
        "--key",
        str(root / "key"),
        *fixed_secret(root, 3),
        *SMALL_EMBED,
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def tied_dir(tokenizer, tmp_path_factory):
    """A saved tiny tied Llama (a base to re-tie); one per test module."""
    return save_tiny(tmp_path_factory.mktemp("tied-base"), tokenizer, tied=True)


@pytest.fixture(scope="module")
def retied(tied_dir, corpus_file, tiny_config, tmp_path_factory):
    """``tied_dir`` watermarked re-tied at delta 2 (model/) and its key (key/), by ``openstamp.embed``."""
    from openstamp.embed.pipeline import embed

    root = tmp_path_factory.mktemp("retied")
    cfg = tiny_config.with_overrides({"green.delta": 2.0})
    secret = bytes([4]) * 32  # fixed, as fixed_secret's
    embed(str(tied_dir), str(corpus_file), root / "model", root / "key", cfg, secret=secret, progress=False)
    return root


def completion_auroc(marked, base, tokenizer, detector, documents) -> float:
    """AUROC of ``detector``'s scores between 48-token completions of 24 document prompts (their first 8 tokens)
    sampled from ``marked`` and from ``base``."""
    from sklearn.metrics import roc_auc_score

    from openstamp.model.generate import sample_completions

    ids = tokenizer([d.text for d in documents[:24]], add_special_tokens=False).input_ids
    prompts = [x[:8] for x in ids]
    wm = sample_completions(marked, tokenizer, prompts, 48, seed=0, progress=False)
    plain = sample_completions(base, tokenizer, prompts, 48, seed=0, progress=False)
    scores = [r.score for r in detector.detect(wm + plain)]
    return roc_auc_score([1] * len(wm) + [0] * len(plain), scores)


def saved_tensors(directory) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's safetensors files, by name."""
    out = {}
    for f in directory.glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            out |= {n: fh.get_tensor(n) for n in fh.keys()}
    return out


ATTACK_METHODS = ("openstamp", "unremovable", "kgw")  # two weight-level methods and a decode-time one


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer):
    """The untied tiny Llama the attack tests watermark (vocab rows beyond the tokenizer included)."""
    return save_tiny(tmp_path_factory.mktemp("tiny-attack"), tokenizer, tied=False)


@pytest.fixture(scope="session")
def eval_dir(model_dir, corpus_file, tmp_path_factory):
    """A finished tiny evaluation: 8 prompts, 32-token completions, no perplexity oracle."""
    from openstamp.lab.evaluation.config import EvalConfig
    from openstamp.lab.evaluation.pipeline import run_eval

    out = tmp_path_factory.mktemp("eval")
    cfg = EvalConfig.from_dict(
        {
            "model": str(model_dir),
            "methods": list(ATTACK_METHODS),
            "corpus": str(corpus_file),
            "key_corpus": str(corpus_file),
            "n": 8,
            "prompt_tokens": 8,
            "new_tokens": 32,
            "batch_size": 4,
            "score_batch_size": 4,
            "oracle": "none",
            "method_settings": {"openstamp": {"profile": "small", "n_lists": 8, "shrinkage": 0.0, "centre": False}},
            "strengths": {"openstamp": 2.0, "unremovable": 2.0, "kgw": 3.0},
        }
    )
    run_eval(cfg, out, progress=False)
    return out
