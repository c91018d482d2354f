"""The model's own perplexity on human text: the cost axis of a watermark."""

import math

import numpy as np
import pytest
import torch
from conftest import make_model

from openstamp.lab.methods.kgw import GreenLists, KGWProcessor
from openstamp.model.perplexity import change, perplexity, window_nll


def windows(n=5, prompt=12, cont=20, vocab=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, prompt + cont), generator=g).tolist()
    return [([1] + row[:prompt], row[prompt:]) for row in ids]


def test_own_nll_matches_the_hugging_face_loss():
    model = make_model(False, 300)
    pairs = windows()
    nll = window_nll(model, pairs, batch_size=2)
    for (prompt, cont), value in zip(pairs, nll, strict=True):
        ids = torch.tensor([prompt + cont])
        labels = ids.clone()
        labels[:, : len(prompt)] = -100  # score the continuation only, as the oracle does
        with torch.no_grad():
            loss = model(input_ids=ids, labels=labels).loss
        assert value == pytest.approx(float(loss), rel=1e-5)
    assert perplexity(nll) == pytest.approx(math.exp(np.mean(nll)))


def test_own_nll_with_the_decoder_in_bfloat16_stays_near_float32():
    """The eval's own_ppl_dtype: the decoder under bfloat16 autocast, the head and NLL in float32."""
    from functools import partial

    from openstamp.model.hidden import final_hidden

    model = make_model(False, 300)
    pairs = windows()
    full = window_nll(model, pairs, batch_size=2)
    half = window_nll(model, pairs, batch_size=2, hidden=partial(final_hidden, dtype="bfloat16"))
    assert half != full  # the decoder did run in bfloat16
    assert half == pytest.approx(full, rel=1e-2)


def test_a_processor_is_applied_as_at_generation():
    model = make_model(True, 300)
    pairs = windows(n=3)
    plain = window_nll(model, pairs)

    class Shift:  # adding a constant to every logit leaves the distribution unchanged
        def __call__(self, input_ids, scores):
            return scores + 3.0

    torch.testing.assert_close(torch.tensor(window_nll(model, pairs, Shift())), torch.tensor(plain))
    processor = KGWProcessor(GreenLists(b"k" * 32, 300, 0.25, excluded=[0, 1, 2]), 2.0)
    biased = window_nll(model, pairs, processor)
    ids = torch.tensor([pairs[0][0] + pairs[0][1]])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    t0 = len(pairs[0][0])
    reference = -sum(
        float(torch.log_softmax(processor(ids[:, :t], logits[t - 1 : t]), -1)[0, ids[0, t]])
        for t in range(t0, ids.shape[1])
    ) / (ids.shape[1] - t0)
    assert biased[0] == pytest.approx(reference, rel=1e-5) and not np.allclose(biased, plain)


def test_positions_taken_a_few_at_a_time_give_the_same_nll():
    model = make_model(False, 300)
    pairs = windows(n=3) + windows(n=2, prompt=5, cont=9, seed=1)  # two window lengths: two groups of batches
    processor = KGWProcessor(GreenLists(b"k" * 32, 300, 0.25, excluded=[0, 1, 2]), 2.0)
    for proc in (None, processor):
        whole = window_nll(model, pairs, proc, batch_size=2)
        for logits in (1, 300 * 2 * 3):  # one position of one row (at least one position is taken), three positions
            torch.testing.assert_close(
                torch.tensor(window_nll(model, pairs, proc, 2, chunk_logits=logits)), torch.tensor(whole)
            )


def test_change_is_paired_and_zero_against_itself():
    a = [2.0, 2.5, 3.0, math.nan]
    same = change(a, a)
    assert same["change"] == pytest.approx(0.0) and same["ci"] == pytest.approx((0.0, 0.0))
    up = change([x + 0.1 for x in a], a)
    assert up["change"] == pytest.approx(math.exp(0.1) - 1)
    assert up["ci"][0] == pytest.approx(up["ci"][1])  # the same shift on every window: no spread
