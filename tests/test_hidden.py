import threading

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from openstamp.config import StatesConfig
from openstamp.corpus import load_documents
from openstamp.embed.states import collect_states, plan_windows
from openstamp.lab.hidden import HiddenCache, autocast_decoder, decoder_dtype, reusing
from openstamp.lab.hidden import lab_hidden as final_hidden
from openstamp.lab.methods.common import right_padded


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


def test_reused_hidden_states_equal_a_fresh_forward_and_follow_the_model(tiny_model_dir, corpus_file):
    model, *_ = setup(tiny_model_dir, corpus_file)
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor([[5, 9, 14, 3], [7, 7, 2, 11]])
    mask = torch.ones_like(ids)
    fresh = final_hidden(model, ids, mask)
    cache = HiddenCache()
    with torch.inference_mode(), reusing(cache):
        first, again = final_hidden(model, ids, mask), final_hidden(model, ids, mask)
        assert again is first and torch.equal(first, fresh)  # the second call ran no decoder
        final_hidden(other, ids, mask)  # another model object: its own forward, never the first model's states
        final_hidden(model, ids[:, :3] + 1, mask[:, :3])  # another batch
    assert (cache.hits, cache.misses) == (1, 3)
    with torch.inference_mode():
        final_hidden(model, ids, mask)  # outside `reusing` nothing is looked up
    assert (cache.hits, cache.misses) == (1, 3)
    small = HiddenCache(max_bytes=fresh.numel() * fresh.element_size())  # room for one batch: the older goes
    with torch.inference_mode(), reusing(small):
        final_hidden(model, ids, mask)
        final_hidden(model, ids[:, :3] + 1, mask[:, :3])
        final_hidden(model, ids, mask)
    assert (small.hits, small.misses, len(small.entries)) == (0, 3, 1)
    assert {key for rows in small.rows.values() for key, *_ in rows} == set(small.entries)  # the dropped rows went
    seen = []  # another thread (a service worker) does not use this thread's active cache
    with torch.inference_mode(), reusing(cache):
        worker = threading.Thread(target=lambda: seen.append(final_hidden(model, ids, mask)))
        worker.start()
        worker.join()
    assert seen[0] is not first and torch.equal(seen[0], fresh) and (cache.hits, cache.misses) == (1, 3)


def test_a_text_cut_from_a_cached_one_takes_its_states_and_runs_no_decoder(tiny_model_dir, corpus_file):
    model, *_ = setup(tiny_model_dir, corpus_file)
    full = [[1, 5, 9, 14, 3, 8, 21], [1, 7, 7, 2, 11, 4], [1, 30, 31, 32, 33]]
    cut = [full[2][:4], full[0][:5], full[1][:6]]  # shorter, in another order (a detector sorts by length)
    cache = HiddenCache()
    with torch.inference_mode(), reusing(cache):
        final_hidden(model, *right_padded(full, 0))
        reused = final_hidden(model, *right_padded(cut, 0))
        assert (cache.hits, cache.prefix_hits, cache.misses) == (0, 1, 1)
        # one row cut elsewhere than any cached row begins (a re-tokenised end): it alone runs the decoder
        mixed = final_hidden(model, *right_padded([full[0][:4], [1, 5, 9, 99]], 0))
        assert (cache.prefix_hits, cache.misses) == (1, 2)
    with torch.inference_mode():
        fresh = final_hidden(model, *right_padded(cut, 0))
        fresh_mixed = final_hidden(model, *right_padded([full[0][:4], [1, 5, 9, 99]], 0))
    for i, row in enumerate(cut):
        torch.testing.assert_close(reused[i, : len(row)], fresh[i, : len(row)], rtol=1e-4, atol=1e-5)
        assert not reused[i, len(row) :].any()  # padding stays zero: no detector reads it
    torch.testing.assert_close(mixed, fresh_mixed, rtol=1e-4, atol=1e-5)
    # left padding (positions given) is never served from rows: its positions do not start at the first column
    ids, mask = right_padded(cut, 0)
    left = torch.zeros_like(ids)
    left_mask = torch.zeros_like(mask)
    for i, row in enumerate(cut):
        left[i, ids.shape[1] - len(row) :], left_mask[i, ids.shape[1] - len(row) :] = torch.tensor(row), 1
    positions = (left_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode(), reusing(cache):
        final_hidden(model, left, left_mask, positions)
    assert (cache.prefix_hits, cache.misses) == (1, 3)


def test_a_prefix_use_keeps_its_entry_from_being_dropped_first(tiny_model_dir, corpus_file):
    model, *_ = setup(tiny_model_dir, corpus_file)
    a, b, c = [[1, 5, 9, 14, 3]], [[1, 7, 7, 2, 11]], [[1, 30, 31, 32, 33]]
    with torch.inference_mode():
        size = final_hidden(model, *right_padded(a, 0)).numel() * 4
    cache = HiddenCache(max_bytes=2 * size)  # room for two batches
    with torch.inference_mode(), reusing(cache):
        final_hidden(model, *right_padded(a, 0))
        final_hidden(model, *right_padded(b, 0))
        final_hidden(model, *right_padded([a[0][:4]], 0))  # a prefix of a: a is now the most recently used
        final_hidden(model, *right_padded(c, 0))  # b, the least recently used, goes
        assert (cache.prefix_hits, cache.misses) == (1, 3)
        final_hidden(model, *right_padded(a, 0))
        final_hidden(model, *right_padded(b, 0))
    assert (cache.hits, cache.misses) == (1, 4)


def test_an_autocast_decoder_returns_float32_states_near_the_model_s_and_the_cache_keeps_precisions_apart(
    tiny_model_dir, corpus_file
):
    model, *_ = setup(tiny_model_dir, corpus_file)
    full, cut = [[1, 5, 9, 14, 3, 8, 21]], [[1, 5, 9, 14, 3]]
    with torch.inference_mode():
        exact = final_hidden(model, *right_padded(full, 0))
        with autocast_decoder("bfloat16"):
            assert decoder_dtype() == "bfloat16"
            rounded = final_hidden(model, *right_padded(full, 0))
        with autocast_decoder("float32"):  # the model's own dtype: no autocast
            assert decoder_dtype() is None
    assert decoder_dtype() is None and rounded.dtype == torch.float32 and not torch.equal(rounded, exact)
    torch.testing.assert_close(rounded, exact, rtol=0.1, atol=0.1)  # bfloat16 keeps about 3 significant digits
    cache = HiddenCache()
    with torch.inference_mode(), reusing(cache):
        final_hidden(model, *right_padded(full, 0))
        with autocast_decoder("bfloat16"):  # neither the batch nor its prefix is taken from float32 states
            assert torch.equal(final_hidden(model, *right_padded(full, 0)), rounded)
            final_hidden(model, *right_padded(cut, 0))
            assert (cache.hits, cache.prefix_hits, cache.misses) == (0, 1, 2)
        assert torch.equal(final_hidden(model, *right_padded(full, 0)), exact) and cache.hits == 1
