"""Merging: the per-tensor formulas at their limits, whole-model merges, and the attack end to end."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_model
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.lab.attacks.merge import MergeConfig, lerp, merge_models, run_merge, slerp, task_merge
from openstamp.model.patch import head, is_tied

runner = CliRunner()


def _pair(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 10, generator=g), torch.randn(6, 10, generator=g)


@pytest.mark.parametrize("interpolate", [lerp, slerp])
def test_interpolations_reproduce_their_endpoints_exactly(interpolate):
    a, b = _pair()
    assert torch.equal(interpolate(a, b, 0.0), a)
    assert torch.equal(interpolate(a, b, 1.0), b)


def test_slerp_of_identical_tensors_is_the_identity_and_keeps_the_norm_between_orthogonal_ones():
    a, _ = _pair()
    assert torch.allclose(slerp(a, a.clone(), 0.3), a, rtol=0, atol=1e-6)  # lerp of a with itself: rounding only
    x, y = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 3.0])
    mid = slerp(x, y, 0.5)  # on the arc: |mid| = 3, where lerp gives 3 / sqrt(2)
    assert torch.allclose(mid, torch.full((2,), 3 / 2**0.5))
    assert float(mid.norm()) == pytest.approx(3.0)


def test_slerp_falls_back_to_lerp_when_nearly_colinear():
    a = torch.tensor([1.0, 2.0, 3.0])
    b = 2 * a + 1e-4
    assert torch.allclose(slerp(a, b, 0.25), lerp(a, b, 0.25))


@pytest.mark.parametrize("how", ["ties", "dare_ties"])
def test_task_merges_reproduce_their_endpoints_at_density_one(how):
    base, _ = _pair(1)
    a, b = _pair(2)
    assert torch.allclose(task_merge(base, [a, b], [1.0, 0.0], 1.0, how), a, atol=1e-6)
    assert torch.allclose(task_merge(base, [a, b], [0.0, 1.0], 1.0, how), b, atol=1e-6)


def test_without_conflicts_task_merges_reduce_to_the_task_vector_sum():
    base = torch.randn(4, 8)
    tau1 = torch.rand(4, 8) * (torch.arange(8) % 2 == 0)  # disjoint supports, so no sign conflict
    tau2 = torch.rand(4, 8) * (torch.arange(8) % 2 == 1)
    expected = base + tau1 + tau2
    for how in ("ties", "dare_ties"):
        merged = task_merge(base, [base + tau1, base + tau2], [1.0, 1.0], 1.0, how)
        assert torch.allclose(merged, expected, atol=1e-6), how
    both = torch.rand(4, 8) + 0.1  # same sign everywhere: ties takes the weighted mean, dare_ties the sum
    ties = task_merge(base, [base + both, base + 3 * both], [1.0, 1.0], 1.0, "ties")
    assert torch.allclose(ties, base + 2 * both, atol=1e-6)


def test_ties_elects_the_sign_and_trims_to_the_density():
    base = torch.zeros(1, 4)
    a = torch.tensor([[1.0, -2.0, 0.1, 0.2]])
    b = torch.tensor([[-3.0, 1.0, 0.1, 0.3]])
    merged = task_merge(base, [a, b], [1.0, 1.0], 0.5, "ties")
    # trimmed: a -> [1, -2, 0, 0], b -> [-3, 1, 0, 0]; elected signs -, -; kept: -3 and -2
    assert torch.allclose(merged, torch.tensor([[-3.0, -2.0, 0.0, 0.0]]))
    dare = task_merge(base, [a, b], [1.0, 1.0], 0.5, "dare_ties", torch.Generator().manual_seed(0))
    again = task_merge(base, [a, b], [1.0, 1.0], 0.5, "dare_ties", torch.Generator().manual_seed(0))
    assert torch.equal(dare, again)


@pytest.mark.parametrize(("how", "density"), [("ties", 1.0), ("ties", 0.4), ("dare_ties", 1.0), ("dare_ties", 0.4)])
def test_task_merges_equal_mergekit(how, density):
    """Where mergekit is installed: its merge of the same tensors, bit for bit (DARE: the same seed)."""
    registry = pytest.importorskip("mergekit.merge_methods.registry")
    from mergekit.merge_methods.base import TensorGroup

    base, a = _pair(3)
    b, _ = _pair(4)
    group = TensorGroup.from_tensors([base, a, b], base_index=0)
    torch.manual_seed(5)  # mergekit draws DARE's drops from the global generator
    theirs = registry.get(how).merge_group(
        group,
        weight={1: 0.3, 2: 0.7},
        density={1: density, 2: density},
        normalize=how == "ties",
        rescale=how == "dare_ties",
        int8_mask=False,
        **{"lambda": 1.0},
    )
    ours = task_merge(base, [a, b], [0.3, 0.7], density, how, torch.Generator().manual_seed(5))
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0])
def test_slerp_equals_mergekit(t):
    mergekit_slerp = pytest.importorskip("mergekit.merge_methods.slerp").slerp
    a, b = _pair(6)
    assert torch.equal(slerp(a, b, t), mergekit_slerp(torch.tensor([t]), a[None], b[None])[0])


@pytest.mark.parametrize("tied", [True, False])
def test_merge_models_keeps_ties_and_hits_the_endpoints(tied, tokenizer):
    model, other, base = (make_model(tied, len(tokenizer), seed=s) for s in (0, 1, 2))
    original = {k: p.detach().clone() for k, p in model.named_parameters()}
    for how in ("linear", "slerp", "ties", "dare_ties"):
        merged = make_model(tied, len(tokenizer), seed=0)
        merge_models(merged, other, how, 0.0, base, density=1.0)
        close = (torch.allclose(p, original[k], rtol=0, atol=1e-6) for k, p in merged.named_parameters())
        assert all(close), how  # linear and slerp exactly; ties and dare_ties up to base + (W - base) rounding
    exact = make_model(tied, len(tokenizer), seed=0)
    merge_models(exact, other, "slerp", 0.0)
    assert all(torch.equal(p, original[k]) for k, p in exact.named_parameters())
    for how in ("linear", "slerp", "ties", "dare_ties"):
        copy_ = make_model(tied, len(tokenizer), seed=0)
        merge_models(copy_, other, how, 1.0, base, density=1.0)
        assert is_tied(copy_) == tied
        assert torch.allclose(head(copy_).weight, head(other).weight, atol=1e-6), how
    merge_models(model, other, "linear", 0.5)
    assert is_tied(model) == tied
    assert torch.allclose(
        head(model).weight,
        (original["lm_head.weight" if not tied else "model.embed_tokens.weight"] + head(other).weight) / 2,
        atol=1e-6,
    )


def test_merging_a_tied_release_with_an_untied_model_unties_it(tokenizer):
    model, other = make_model(True, len(tokenizer)), make_model(False, len(tokenizer), seed=1)
    embeddings = model.get_input_embeddings().weight.detach().clone()
    note = merge_models(model, other, "linear", 1.0)
    assert note["untied"] and not is_tied(model)
    assert torch.equal(head(model).weight, head(other).weight)
    assert torch.equal(model.get_input_embeddings().weight, other.get_input_embeddings().weight)
    assert not torch.equal(embeddings, other.get_input_embeddings().weight)


def test_a_model_of_another_vocabulary_is_refused(tokenizer):
    with pytest.raises(ValueError, match="vocabulary"):
        merge_models(make_model(False, len(tokenizer)), make_model(False, len(tokenizer) + 4), "linear", 0.5)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        MergeConfig(t=(0.5, 1.5))
    with pytest.raises(ValueError, match="merges"):
        MergeConfig(merges=("average",))


def test_merge_attack_end_to_end(eval_dir, tmp_path):
    out = tmp_path / "merge"
    cfg = MergeConfig(t=(0.5, 1.0), merges=("linear", "ties"), n=4, ppl_windows=2, seq_len=32)
    results = run_merge(eval_dir, out, cfg, progress=False)
    assert results["skipped"] == ["kgw"]
    settings = {(r["method"], r["merge"], r["t"]) for r in results["runs"]}
    for method in ("openstamp", "unremovable"):
        assert {(method, "linear", 0.5), (method, "linear", 1.0), (method, "ties", 0.5)} <= settings
    back_to_base = [r for r in results["runs"] if r["merge"] == "linear" and r["t"] == 1.0]
    assert all(r["ppl"] == pytest.approx(results["with_model_ppl"], rel=1e-5) for r in back_to_base)
    section = (eval_dir / "attacks" / "merge.md").read_text()
    assert "linear t=0.5" in section and (out / "merge_tpr.png").exists()


def test_merge_cli(eval_dir, tmp_path):
    args = ["attack", "merge", "--eval", str(eval_dir), "--out", str(tmp_path / "m"), "--method", "slerp"]
    result = runner.invoke(app, [*args, "--t", "0.3", "--n", "2", "--ppl-windows", "1", "--seq-len", "32"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "m" / "settings.json").read_text())["t"] == [0.3]
    bad = runner.invoke(app, [*args, "--t", "1.2"])
    assert bad.exit_code == 2 and "[0, 1]" in bad.output


def test_merge_cli_refuses_a_model_of_another_vocabulary(eval_dir, tokenizer, tmp_path):
    other = tmp_path / "other-vocab"
    make_model(False, len(tokenizer) + 20).save_pretrained(other)
    tokenizer.save_pretrained(other)
    args = ["attack", "merge", "--eval", str(eval_dir), "--out", str(tmp_path / "m"), "--with", str(other)]
    bad = runner.invoke(app, args)
    assert bad.exit_code == 2 and "vocabulary" in bad.output
    assert not (tmp_path / "m" / "settings.json").exists()
