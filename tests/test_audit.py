"""The release audit on tiny tied and untied checkpoints."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from openstamp.cli import app as cli
from openstamp.key import WatermarkKey
from openstamp.model.patch import apply_watermark, head
from openstamp.model.similarity import similarity
from openstamp.release.audit import audit, sketch_rank

runner = CliRunner()


def highs(findings, check=None):
    return [f for f in findings if f.severity == "high" and (check is None or f.check == check)]


def source_is_tied(model_dir) -> bool:
    return json.loads((model_dir / "config.json").read_text())["tie_word_embeddings"]


def make_release(model_dir, root, mode):
    """A watermarked copy of the tiny model (L = 6 lists, P random) in ``mode``, and its key."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    V, d = head(model).weight.shape
    g = torch.Generator().manual_seed(0)
    key = WatermarkKey(
        secret=bytes(range(32)),
        selector=torch.randn(6, d, generator=g),
        projection=torch.randn(d, d, generator=g) / d**0.5,
        gamma=0.25,
        delta=1.0,
        vocab_size=V,
    )
    apply_watermark(model, key, mode)
    model.save_pretrained(root / "model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, root / "model" / name)
    key.save(root / "key")
    return root


@pytest.fixture(scope="module")
def release(tiny_model_dir, tmp_path_factory):
    """The leaky export (``untie``): most checks below are about what it gives away."""
    return make_release(tiny_model_dir, tmp_path_factory.mktemp("audit"), "untie")


@pytest.fixture(scope="module")
def retied(tiny_model_dir, tmp_path_factory):
    """The default export (``retie``)."""
    return make_release(tiny_model_dir, tmp_path_factory.mktemp("audit-retie"), "retie")


def test_a_retied_release_leaks_no_copy_of_u_and_an_untied_export_of_a_tied_model_does(release, retied, tiny_model_dir):
    tied = source_is_tied(tiny_model_dir)
    assert highs(audit(retied / "model")) == [] and highs(audit(retied / "model", retied / "key")) == []
    with_base = audit(retied / "model", retied / "key", base=str(tiny_model_dir))
    assert highs(with_base, "copy of U") == []
    # the public base alone exposes dW, re-tied or not
    assert [f.check for f in highs(with_base)] == ["base"]
    leaky = highs(audit(release / "model", base=str(tiny_model_dir)), "copy of U")
    if tied:  # the untie export's input embeddings are the base's U
        (finding,) = leaky
        assert finding.message.startswith("model.embed_tokens.weight equals") and "--tied-head retie" in finding.message
        assert any(
            "tied to the input embeddings" in f.message and "re-tied" in f.message
            for f in audit(retied / "model", retied / "key")
        )
    else:  # an untied base keeps its own input embeddings; they are not U
        assert leaky == []


def copy_release(release, tmp_path):
    shutil.copytree(release / "model", tmp_path / "model")
    return tmp_path / "model"


def test_a_tied_then_untied_release_is_high_and_a_clean_untied_one_is_not(release, tiny_model_dir):
    without_key = audit(release / "model")
    with_key = audit(release / "model", release / "key")
    if source_is_tied(tiny_model_dir):
        (finding,) = highs(without_key)
        assert finding.check == "tied head" and "low rank" in finding.message
        assert finding.details == ["numerical rank of lm_head - input embeddings: 6 of 32"]
        assert "records an untied export of a tied model" in highs(with_key, "tied head")[0].message
    else:
        assert highs(without_key) == [] and highs(with_key) == []
        assert any("separate and unrelated" in f.message for f in without_key)
    assert any(f.check == "fingerprint" and "carries the watermark" in f.message for f in with_key)


def test_cli_exit_code_and_json(release, tiny_model_dir):
    result = runner.invoke(cli, ["audit", str(release / "model"), "--key", str(release / "key"), "--json"])
    report = json.loads(result.stdout)
    tied = source_is_tied(tiny_model_dir)
    assert result.exit_code == (1 if tied else 0)
    assert report["summary"]["high"] == (1 if tied else 0) and report["findings"]
    table = runner.invoke(cli, ["audit", str(release / "model")])
    assert "tied head" in table.stdout and table.exit_code == (1 if tied else 0)


def test_key_material_in_the_checkpoint_is_high(release, tmp_path):
    model_dir = copy_release(release, tmp_path)
    shutil.copytree(release / "key", model_dir / "key")
    key = WatermarkKey.load(release / "key")
    (model_dir / "README.md").write_text(f"Made with OpenStamp. secret: {key.secret.hex()}\n")
    save_file({"selector": torch.zeros(2, 2)}, str(model_dir / "extra.safetensors"))
    shutil.copy(release / "key" / "key.json", model_dir / "settings.json")  # a key header under another name
    findings = audit(model_dir, release / "key")
    messages = [f.message for f in highs(findings, "key material")]
    for expected in (
        "key file key/key.json",
        "key file key/secret",
        "key file key/key.safetensors",
        "the secret appears in README.md",
        "the selector S appears in key/key.safetensors",
        "the projection P appears in key/key.safetensors",
        "settings.json looks like an OpenStamp key",
    ):
        assert any(expected in m for m in messages), (expected, messages)
    named = [f for f in highs(findings, "key material") if f.message == "tensors named like key material"]
    assert sorted(named[0].details) == ["projection", "selector"]
    without_key = audit(model_dir)  # the file names and tensor names alone are enough
    assert len(highs(without_key, "key material")) >= 4


def test_openstamp_specific_files_are_medium(release, tmp_path):
    model_dir = copy_release(release, tmp_path)
    (model_dir / "openstamp_source.json").write_text('{"alias": "tiny"}')
    mediums = [f for f in audit(model_dir) if f.severity == "medium"]
    assert [f.check for f in mediums] == ["openstamp file"]


def test_base_comparison(release, tiny_model_dir, tmp_path):
    identical = audit(tiny_model_dir, base=str(tiny_model_dir))
    assert any("identical to the base" in f.message for f in highs(identical, "base"))
    exposed = audit(release / "model", base=str(tiny_model_dir))
    (finding,) = highs(exposed, "base")
    assert "dW = U~ - U_base" in finding.message and finding.details == ["numerical rank of the difference: 6 of 32"]
    assert any(f.severity == "info" and "tensors equal the base" in f.message for f in exposed)
    assert not [f for f in exposed if f.severity == "medium"]
    # a release that also changed another tensor and a config key
    model_dir = copy_release(release, tmp_path)
    weights = load_file(str(model_dir / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] + 1
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.5}))
    changed = audit(model_dir, base=str(tiny_model_dir))
    (medium,) = [f for f in changed if f.severity == "medium"]
    assert medium.details == ["differs: model.norm.weight"]
    assert any(any(d.startswith("rms_norm_eps") for d in f.details) for f in changed if f.check == "base")


def test_the_original_model_with_its_key_is_not_watermarked(release, tiny_model_dir):
    findings = audit(tiny_model_dir, release / "key")
    assert any("original, unwatermarked head" in f.message for f in highs(findings, "fingerprint"))


def test_sketch_rank():
    g = torch.Generator().manual_seed(0)
    low = torch.randn(3000, 5, generator=g) @ torch.randn(5, 40, generator=g)
    full = torch.randn(3000, 40, generator=g)
    assert sketch_rank(iter(low.split(700)), 40) == 5
    assert sketch_rank(iter(full.split(700)), 40) == 40
    assert sketch_rank(iter([torch.zeros(10, 40)]), 40) == 0
    noisy = low + 1e-7 * torch.randn(3000, 40, generator=g)  # fp32 rounding noise does not count
    assert sketch_rank(iter([noisy]), 40) == 5


def test_audit_refuses_what_it_cannot_read(tmp_path):
    result = runner.invoke(cli, ["audit", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "not a directory" in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(cli, ["audit", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no safetensors" in result.output


def test_similarity_is_blockwise_centred_and_scale_free():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1000, 24, generator=g), torch.randn(1000, 24, generator=g)
    same = similarity(iter(a.split(128)), iter(a.split(128)))
    assert same.cosine == pytest.approx(1.0) and same.relative_difference == 0.0
    shifted = 3 * a + torch.randn(1, 24, generator=g)  # a scaled copy with a shared row added still leaks
    assert similarity(iter(shifted.split(300)), iter(a.split(300))).cosine == pytest.approx(1.0, abs=1e-6)
    assert abs(similarity(iter([a]), iter([b])).cosine) < 0.1
    near = similarity(iter(a.split(7)), iter((a + 0.5 * b).split(7)))
    assert near.cosine == pytest.approx(1 / 1.25**0.5, abs=0.02) and 0.3 < near.relative_difference < 0.6


def save_weights(model_dir, change):
    weights = load_file(str(model_dir / "model.safetensors"))
    weights.update(change(weights))
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def base_u(tiny_model_dir):
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    return base.get("lm_head.weight", base["model.embed_tokens.weight"])


def noisy(u, scale=0.05):
    return u + torch.randn(u.shape, generator=torch.Generator().manual_seed(3)) * scale * u.std()


def test_an_untied_release_with_embeddings_near_u_is_a_near_copy(release, tiny_model_dir, tmp_path):
    """lm_head = U + a realistic dW (||dW|| = 0.3 ||U||, SmolLM2 at delta 2), embeddings = U + 5% noise: no exact
    copy, and lm_head - embeddings has full rank, yet it is mostly dW."""
    u = base_u(tiny_model_dir)
    dw = WatermarkKey.load(release / "key").delta_w()
    model_dir = copy_release(release, tmp_path)
    change = {"lm_head.weight": u + dw * (0.3 * u.norm() / dw.norm()), "model.embed_tokens.weight": noisy(u)}
    save_weights(model_dir, lambda w: change)
    (finding,) = highs(audit(model_dir))
    assert finding.check == "near copy" and "lm_head and the input embeddings" in finding.message
    rank = int(finding.details[0].split(": ")[1].split()[0])
    assert rank > 0.75 * 32  # the rank test alone misses it
    assert float(finding.details[1].split()[1].rstrip(",")) > 0.9
    with_base = highs(audit(model_dir, base=str(tiny_model_dir)), "near copy")
    assert any(f.message.startswith("model.embed_tokens.weight is a near copy of") and "(U)" in f.message
               for f in with_base)  # fmt: skip
    assert highs(audit(model_dir, near_cosine=0.999)) == []  # the threshold is the option's


def test_the_key_finds_a_near_copy_of_u_that_u_tilde_hides(release, tiny_model_dir, tmp_path):
    """This key's dW is large (||dW|| = 7.5 ||U||), so U~ no longer resembles U; U~ - dW does."""
    model_dir = copy_release(release, tmp_path)
    save_weights(model_dir, lambda w: {"model.embed_tokens.weight": noisy(base_u(tiny_model_dir))})
    assert highs(audit(model_dir), "near copy") == []
    (finding,) = highs(audit(model_dir, release / "key"), "near copy")
    assert finding.message.startswith("model.embed_tokens.weight is a near copy of the original unembedding U")


def test_proper_releases_have_no_near_copies(release, retied, tiny_model_dir):
    assert highs(audit(retied / "model", base=str(tiny_model_dir)), "near copy") == []
    assert highs(audit(retied / "model", retied / "key"), "near copy") == []
    findings = audit(release / "model", release / "key", base=str(tiny_model_dir))
    assert highs(findings, "near copy") == []  # the untie export's exact copy of U is the other checks' finding
    if not source_is_tied(tiny_model_dir):  # an untied base's embeddings differ from its head, as in real models
        (tied,) = [f for f in findings if f.check == "tied head"]
        cosine = float(tied.details[1].split()[1].rstrip(","))
        assert "separate and unrelated" in tied.message and abs(cosine) < 0.2


def test_a_second_copy_of_the_head_under_another_name_is_a_near_copy(retied, tmp_path):
    model_dir = copy_release(retied, tmp_path)
    save_weights(
        model_dir, lambda w: {"old_head": w.get("lm_head.weight", w["model.embed_tokens.weight"]) * 0.9 + 0.01}
    )
    (finding,) = highs(audit(model_dir), "near copy")
    assert finding.message.startswith("old_head is a near copy of the released unembedding")
