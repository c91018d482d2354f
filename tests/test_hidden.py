import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from openstamp.config import StatesConfig
from openstamp.corpus import load_documents
from openstamp.hidden import collect_states, final_hidden, plan_windows


def setup(tiny_model_dir, corpus_file):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    docs = load_documents(str(corpus_file))
    cfg = StatesConfig(
        n_states=96,
        window_tokens=48,
        positions_per_window=16,
        min_context=4,
        context_tokens=8,
        batch_size=3,
        seed=1,
    )
    return model, tok, docs, cfg


def test_states_are_deterministic_and_bounded(tiny_model_dir, corpus_file):
    model, tok, docs, cfg = setup(tiny_model_dir, corpus_file)
    a = collect_states(model, tok, docs, cfg, progress=False)
    b = collect_states(model, tok, docs, cfg, progress=False)
    assert a.hidden.shape == (96, model.config.hidden_size) and len(a.texts) == 96
    assert torch.equal(a.hidden, b.hidden) and a.texts == b.texts


def test_each_state_is_the_last_hidden_state_of_its_prefix(tiny_model_dir, corpus_file):
    model, tok, docs, cfg = setup(tiny_model_dir, corpus_file)
    states = collect_states(model, tok, docs, cfg, progress=False)
    windows = plan_windows(tok, docs, cfg)
    row = 0
    for w in windows[:2]:
        for t in w.positions[:3]:
            prefix = torch.tensor([w.ids[: t + 1]])
            alone = final_hidden(model, prefix, torch.ones_like(prefix))[0, -1]
            torch.testing.assert_close(states.hidden[row], alone, rtol=1e-4, atol=1e-5)
            assert states.texts[row] == tok.decode(
                w.ids[max(0, t + 1 - cfg.context_tokens) : t + 1], skip_special_tokens=True
            )
            row += 1
        row += len(w.positions) - 3


def test_different_seeds_sample_different_positions(tiny_model_dir, corpus_file):
    model, tok, docs, cfg = setup(tiny_model_dir, corpus_file)
    other = StatesConfig(**{**cfg.__dict__, "seed": 2})
    assert plan_windows(tok, docs, cfg) != plan_windows(tok, docs, other)
