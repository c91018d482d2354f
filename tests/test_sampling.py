import pytest
import torch
from scipy.stats import chisquare

from openstamp.model.generate import InverseCDFSampler, sample_completions
from openstamp.model.load import load_model, sampling_copy

INF = float("inf")


def draws(sampler: InverseCDFSampler, scores: torch.Tensor, rows: int = 40_000) -> torch.Tensor:
    torch.manual_seed(0)
    out = sampler(None, scores.repeat(rows, 1))
    assert ((out == 0).sum(-1) == 1).all() and torch.isinf(out).sum(-1).eq(scores.shape[1] - 1).all()
    return torch.bincount(out.argmax(-1), minlength=scores.shape[1])


def test_the_sampler_draws_from_the_softmax_of_the_scores_over_the_temperature():
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, -INF]])
    counts = draws(InverseCDFSampler(temperature=1.5), scores)
    assert counts[-1] == 0  # a token the processors removed (EOS before min_new_tokens) is never drawn
    expected = torch.softmax(scores[0, :-1].double() / 1.5, -1) * float(counts.sum())
    assert chisquare(counts[:-1].numpy(), expected.numpy()).pvalue > 1e-3


def test_top_p_keeps_the_nucleus_and_draws_inside_it_in_proportion():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    counts = draws(InverseCDFSampler(top_p=0.7), probs.log()[None])
    assert counts[2:].sum() == 0  # 0.5 + 0.3 reach 0.7: the rest is cut
    assert (
        chisquare(
            counts[:2].numpy(), (probs[:2].double() / probs[:2].double().sum() * float(counts.sum())).numpy()
        ).pvalue
        > 1e-3
    )


def test_sampling_is_seeded_and_needs_a_positive_temperature(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    prompts = [[5, 6, 7], [8, 9]]
    a = sample_completions(model, tok, prompts, 12, seed=3, progress=False)
    assert a == sample_completions(model, tok, prompts, 12, seed=3, progress=False)
    assert a != sample_completions(model, tok, prompts, 12, seed=4, progress=False)
    assert all(len(ids) == 12 for ids in a)
    with pytest.raises(ValueError, match="temperature > 0"):
        InverseCDFSampler(temperature=0.0)


def test_a_sampling_copy_is_the_model_cast_with_its_ties_and_leaves_the_model_alone(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    assert sampling_copy(model, "float32") is model
    head, attention = model.lm_head.weight.detach().clone(), model.config._attn_implementation
    cast = sampling_copy(model, "bfloat16")
    assert cast.dtype == torch.bfloat16 and model.dtype == torch.float32
    assert torch.equal(model.lm_head.weight, head) and model.config._attn_implementation == attention
    assert torch.equal(cast.lm_head.weight, head.to(torch.bfloat16))  # the weights as they are now, watermark too
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    assert (cast.lm_head.weight is cast.get_input_embeddings().weight) == tied
    assert cast.config._attn_implementation == "eager"
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])  # a left-padded row beside a full one
    mask = (ids != 0).long()
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=mask).logits
        got = cast(input_ids=ids, attention_mask=mask).logits.float()
    assert torch.allclose(got[mask.bool()], want[mask.bool()], atol=0.05 * want.abs().max().item())
    out = sample_completions(cast, tok, [[5, 6, 7], [8, 9]], 6, seed=0, progress=False)
    assert [len(row) for row in out] == [6, 6]
