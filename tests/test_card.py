"""A release says what it is: a model card and watermark.json, with no key material, that the audit passes."""

import base64
import json
from dataclasses import fields

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.embed.pipeline import Release, write_release
from openstamp.key import WatermarkKey
from openstamp.model.patch import head
from openstamp.release.audit import audit
from openstamp.release.card import CARD_FILE, DISCLOSURE_FILE, Disclosure, model_card, read_disclosure

runner = CliRunner()


def key_needles(key: WatermarkKey) -> dict[str, list[bytes]]:
    """Byte strings that would betray the key: the secret in every spelling, S and P."""
    secret = key.secret
    needles = {"secret": [secret, secret.hex().encode(), secret.hex().upper().encode(), base64.b64encode(secret)]}
    needles["selector"] = [key.selector.contiguous().numpy().tobytes()[:64], json.dumps(key.selector[0, 0].item())]
    if key.projection is not None:
        needles["projection"] = [key.projection.contiguous().numpy().tobytes()[:64]]
    return {k: [n.encode() if isinstance(n, str) else n for n in v] for k, v in needles.items()}


def test_embed_writes_a_card_and_watermark_json_without_key_material(release):
    model_dir, key = release / "model", WatermarkKey.load(release / "key")
    card, disclosure = (model_dir / CARD_FILE).read_text(), json.loads((model_dir / DISCLOSURE_FILE).read_text())
    assert sorted(disclosure) == sorted(f.name for f in fields(Disclosure))
    assert disclosure["method"] == "OpenStamp" and disclosure["key_id"] == key.key_id
    assert disclosure["gamma"] == key.gamma and disclosure["n_lists"] == key.n_lists
    assert disclosure["tied_head"] == key.meta["model"]["tied_head"] and disclosure["verify_url"] is None
    assert "delta" not in disclosure
    assert "/" not in disclosure["base_model"]  # a local base by its folder name, not the owner's path
    header = card.split("---")[1]
    assert "library_name: transformers" in header and "- watermarked" in header and "- openstamp" in header
    assert "base_model" not in header  # not a hub id: the Hub would reject it
    assert "OpenStamp: A Watermark for Open-Source Language Models" in card and key.key_id in card
    assert "contact the owner" in card
    assert disclosure["backbone_repaired"] is False and "only the\nunembedding differs" in card
    for name in (CARD_FILE, DISCLOSURE_FILE):
        data = (model_dir / name).read_bytes()
        for what, needles in key_needles(key).items():
            assert not any(n in data for n in needles), (name, what)
    assert read_disclosure(model_dir) == Disclosure.from_dict(disclosure)


def test_the_audit_passes_the_disclosure(release, tiny_model_dir):
    findings = audit(release / "model", release / "key")
    assert [f for f in findings if f.severity != "info"] == []
    (info,) = [f for f in findings if f.check == "disclosure"]
    assert "disclose the watermark" in info.message and any(d.startswith("key_id: ") for d in info.details)
    result = runner.invoke(app, ["audit", str(release / "model"), "--key", str(release / "key")])
    assert result.exit_code == 0, result.output


def test_the_audit_flags_a_disclosure_that_says_more_or_names_another_key(release, tmp_path):
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(release / "model", model_dir)
    key = WatermarkKey.load(release / "key")
    good = json.loads((model_dir / DISCLOSURE_FILE).read_text())
    (model_dir / DISCLOSURE_FILE).write_text(json.dumps({**good, "delta": key.delta}))
    (medium,) = [f for f in audit(model_dir) if f.severity == "medium"]
    assert medium.check == "disclosure" and "delta" in medium.message
    (model_dir / DISCLOSURE_FILE).write_text(json.dumps({**good, "key_id": "0" * 16}))
    (medium,) = [f for f in audit(model_dir, release / "key") if f.severity == "medium"]
    assert "names key 0000000000000000" in medium.message
    (model_dir / DISCLOSURE_FILE).write_text(json.dumps({**good, "secret": key.secret.hex()}))
    assert any("the secret appears in watermark.json" in f.message for f in audit(model_dir, release / "key"))


@pytest.fixture
def patched(tiny_model_dir):
    """The tiny model and a hand-made key (L = 4, P random), not yet applied."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    V, d = head(model).weight.shape
    g = torch.Generator().manual_seed(1)
    key = WatermarkKey(
        secret=bytes(range(100, 132)),
        selector=torch.randn(4, d, generator=g),
        projection=torch.randn(d, d, generator=g) / d**0.5,
        gamma=0.25,
        delta=1.0,
        vocab_size=V,
    )
    return model, AutoTokenizer.from_pretrained(tiny_model_dir), key


def test_no_disclose_writes_neither(patched, tiny_model_dir, tmp_path):
    model, tokenizer, key = patched
    write_release(model, tokenizer, key, tmp_path / "k", tmp_path / "m", "retie", str(tiny_model_dir), False,
                  Release(disclose=False))  # fmt: skip
    assert not (tmp_path / "m" / CARD_FILE).exists() and not (tmp_path / "m" / DISCLOSURE_FILE).exists()
    assert (tmp_path / "m" / "config.json").exists() and read_disclosure(tmp_path / "m") is None
    assert any("does not say it is watermarked" in f.message for f in audit(tmp_path / "m"))


def test_the_card_names_the_verify_url_and_keeps_the_base_license_not_its_body(patched, tiny_model_dir, tmp_path):
    model, tokenizer, key = patched
    base = tmp_path / "base"
    base.mkdir()
    for f in tiny_model_dir.iterdir():
        (base / f.name).write_bytes(f.read_bytes())
    card = "---\nlicense: apache-2.0\ndatasets: [x]\n---\n# The base model\nUse it as follows.\n"
    (base / CARD_FILE).write_text(card)
    url = "https://verify.example.org/v1"
    write_release(model, tokenizer, key, tmp_path / "k", tmp_path / "m", "retie", str(base), False,
                  Release(verify_url=url))  # fmt: skip
    card = (tmp_path / "m" / CARD_FILE).read_text()
    assert url in card and "contact the owner" not in card
    assert "license: apache-2.0" in card.split("---")[1] and "datasets" not in card
    assert "Use it as follows" not in card and "carries over: `apache-2.0`" in card
    assert read_disclosure(tmp_path / "m").verify_url == url
    for what, needles in key_needles(key).items():
        assert not any(n in (tmp_path / "m" / CARD_FILE).read_bytes() for n in needles), what


def test_a_hub_base_goes_into_the_header_and_bad_fields_are_refused():
    disclosure = Disclosure(key_id="0123456789abcdef", gamma=0.25, n_lists=16, tied_head="retie",
                            base_model="HuggingFaceTB/SmolLM2-135M-Instruct")  # fmt: skip
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in model_card(disclosure).split("---")[1]
    assert disclosure.gguf_metadata()["openstamp.key_id"] == "0123456789abcdef"
    assert "openstamp.verify_url" not in disclosure.gguf_metadata()
    for bad in ({"key_id": "secret"}, {"gamma": 1.5}, {"tied_head": "both"}, {"verify_url": "ftp://x"}):
        with pytest.raises(ValueError):
            Disclosure.from_dict({**disclosure.to_dict(), **bad})
    with pytest.raises(ValueError, match="beyond the disclosure"):
        Disclosure.from_dict({**disclosure.to_dict(), "selector": [1.0]})


def test_cli_refuses_a_bad_verify_url_before_any_work(tiny_model_dir, tmp_path):
    args = ["embed", "--model", str(tiny_model_dir), "--out", str(tmp_path / "m"), "--key", str(tmp_path / "k")]
    result = runner.invoke(app, [*args, "--verify-url", "not a url"])
    assert result.exit_code == 2 and "http(s) URL" in result.output
    assert not (tmp_path / "k").exists()
