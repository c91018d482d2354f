"""Hidden states written in shards and the selector fitted by streaming over them."""

import dataclasses

import pytest
import torch
from conftest import SMALL_EMBED, fixed_secret, make_model
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.corpus import load_documents
from openstamp.embed.build import build_key, split_by_document
from openstamp.embed.selector import fit_selector_streaming
from openstamp.embed.shards import write_state_shards
from openstamp.embed.states import SAMPLED_PROMPT, collect_states, sampled_windows
from openstamp.key.selector import fit_selector
from openstamp.model.text import bos_prefix, encode


@pytest.fixture(scope="module")
def docs(corpus_file):
    return load_documents(str(corpus_file))


def test_shards_hold_exactly_the_in_memory_states(tokenizer, docs, tiny_config, tmp_path):
    model = make_model(False, len(tokenizer))
    cfg = tiny_config.states
    states = collect_states(model, tokenizer, docs, cfg, progress=False)
    shards = write_state_shards(model, tokenizer, docs, cfg, tmp_path, progress=False)
    assert len(shards) == len(states) and len(shards.counts) > 1
    assert torch.equal(shards.document, states.document)
    index = torch.randperm(len(states), generator=torch.Generator().manual_seed(0))[:100]
    assert torch.allclose(shards.load(index), states.hidden[index], atol=1e-6)
    assert shards.texts_at(index) == [states.texts[i] for i in index.tolist()]
    seen = torch.cat([w for w, _ in shards.chunks(index, size=37)])  # chunks cover the index once
    assert sorted(seen.tolist()) == list(range(len(index)))


# torch: the GPU path, run on the CPU; shrinkage 2: both fits take the penalty from the states' diagonal
@pytest.mark.parametrize("kmeans,shrinkage", [("sklearn", 0.0), ("torch", 0.0), ("sklearn", 2.0)])
def test_streamed_selector_matches_the_in_memory_fit(kmeans, shrinkage, tokenizer, docs, tiny_config, tmp_path):
    model = make_model(False, len(tokenizer))
    shards = write_state_shards(model, tokenizer, docs, tiny_config.states, tmp_path, progress=False)
    train, held = split_by_document(shards, 0.1, 0)
    cfg = dataclasses.replace(tiny_config.selector, kmeans=kmeans, shrinkage=shrinkage)
    S, stats = fit_selector_streaming(shards, train, held, None, cfg)
    hidden = shards.load(torch.arange(len(shards)))
    S_mem, stats_mem = fit_selector(hidden[train], hidden[held], cfg)
    assert S.shape[1] == S_mem.shape[1] == hidden.shape[1] and S.shape[0] >= 2
    assert set(stats_mem) <= set(stats) and stats["kmeans"].startswith({"torch": "torch", "sklearn": "scikit"}[kmeans])
    assert stats["train_accuracy"] > 0.6 and stats["train_accuracy"] > stats_mem["train_accuracy"] - 0.2
    own = (hidden[train] @ S.T).max(-1).values.mean()  # rescaled: the winning value averages about 1
    assert 0.5 < float(own) < 2.0
    if shrinkage:  # the penalty comes from the same states' diagonal in both fits (streamed: the kept clusters')
        assert stats["ridge_lambda"] == pytest.approx(stats_mem["ridge_lambda"], rel=0.05)
        assert stats["ridge_lambda"] > 100 * cfg.ridge_lambda


def test_embed_with_device_map_and_sharded_states(tiny_model_dir, corpus_file, tmp_path):
    args = ["embed", "--model", str(tiny_model_dir), "--corpus", str(corpus_file), *SMALL_EMBED]
    out = ["--out", str(tmp_path / "model"), "--key", str(tmp_path / "key")]
    extra = ["--device-map", "auto", "--states-dir", str(tmp_path / "states"), *fixed_secret(tmp_path, 14)]
    result = CliRunner().invoke(app, [*args, *out, *extra])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "states").glob("states-*.safetensors"))) >= 1
    import json

    meta = json.loads((tmp_path / "key" / "key.json").read_text())
    assert "streamed" in json.dumps(meta) and meta["stats"]["n_states"] == 256


def test_build_key_from_shards_gives_a_working_key(tokenizer, docs, tiny_config, tmp_path):
    model = make_model(True, len(tokenizer))
    key = build_key(model, tokenizer, docs, tiny_config, progress=False, states_dir=tmp_path)
    assert key.selector.shape[1] == model.config.hidden_size and key.selector.shape[0] >= 2
    assert key.meta["stats"]["n_states"] == tiny_config.states.n_states
    assert key.meta["stats"]["selector"]["effective_strength"] > 0


@pytest.mark.filterwarnings("ignore:the corpus gives")  # every window of the corpus and of the samples is taken
def test_sampled_windows_add_the_models_own_text(tokenizer, docs, tiny_config, tmp_path):
    model, docs = make_model(False, len(tokenizer)), docs[:8]
    cfg = dataclasses.replace(tiny_config.states, generated_windows=6, n_states=10**6)
    windows = sampled_windows(model, tokenizer, docs, cfg, progress=False)
    assert windows == sampled_windows(model, tokenizer, docs, cfg, progress=False)  # seeded
    assert len(windows) == 6 and all(len(w) == cfg.window_tokens for w in windows)
    corpus = encode(tokenizer, [d.text for d in docs])
    prompt = windows[0][len(bos_prefix(tokenizer)) :][:SAMPLED_PROMPT]
    assert any(str(prompt)[1:-1] in str(ids) for ids in corpus)  # each starts from corpus tokens

    plain = collect_states(model, tokenizer, docs, dataclasses.replace(cfg, generated_windows=0), progress=False)
    states = collect_states(model, tokenizer, docs, cfg, progress=False)
    sampled = states.document >= len(docs)  # every sampled window is a document of its own, after the corpus's
    assert int(sampled.sum()) == 6 * cfg.positions_per_window and len(states) == len(plain) + int(sampled.sum())
    shards = write_state_shards(model, tokenizer, docs, cfg, tmp_path, progress=False)
    assert torch.equal(shards.document, states.document)

    key = build_key(model, tokenizer, docs, tiny_config.with_overrides({"states.generated_windows": 6}),
                    states=states, progress=False)  # fmt: skip
    assert key.meta["stats"]["n_sampled_states"] == 6 * cfg.positions_per_window
    assert key.meta["config"]["states"]["generated_windows"] == 6
