"""Which backbone reads the text: a re-tied release's (it carries U~ in its input embeddings) or the original's,
where the owner passes the base beside the release (``Detector(..., base=)``, ``detect --base``)."""

import numpy as np
import pytest
from conftest import save_tiny
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.config import DetectConfig
from openstamp.detect import Detector
from openstamp.errors import KeyMismatchError
from openstamp.key import WatermarkKey
from openstamp.model.hidden import final_hidden


@pytest.fixture(scope="module")
def parts(retied, tied_dir, tokenizer):
    release = AutoModelForCausalLM.from_pretrained(retied / "model").eval()
    base = AutoModelForCausalLM.from_pretrained(tied_dir).eval()
    return release, base, WatermarkKey.load(retied / "key"), tokenizer


def random_texts(tokenizer, n: int, length: int = 48, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, len(tokenizer) - 1, size=length).tolist() for _ in range(n)]


def test_the_base_backbone_reads_the_text_when_the_base_is_given(parts):
    release, base, key, tok = parts
    seen = []

    def hidden(model, *args, **kwargs):
        seen.append(model)
        return final_hidden(model, *args, **kwargs)

    config = DetectConfig(min_tokens=8)
    on_base = Detector(release, tok, key, config, hidden=hidden, base=base)
    result = on_base.detect(random_texts(tok, 2))[0]
    assert seen and all(m is base for m in seen) and result.backbone == "original" and on_base.backbone == "original"
    assert result.to_dict()["backbone"] == "original"
    plain = Detector(release, tok, key, config)
    assert plain.backbone == "release" and plain.detect(random_texts(tok, 1))[0].backbone == "release"
    # the original alone, re-tied key: as before, the release's backbone is rebuilt on a copy
    assert Detector(base, tok, key, config).backbone == "release"


def test_a_base_that_is_not_the_keys_original_is_refused(parts, tokenizer, tmp_path):
    release, base, key, tok = parts
    other = AutoModelForCausalLM.from_pretrained(save_tiny(tmp_path / "other", tokenizer, tied=True)).eval()
    import torch

    with torch.no_grad():
        other.lm_head.weight.add_(0.01)  # another base: its head matches neither of the key's
    with pytest.raises(KeyMismatchError, match="not the original"):
        Detector(release, tok, key, DetectConfig(), base=other)
    with pytest.raises(KeyMismatchError, match="not the original"):
        Detector(release, tok, key, DetectConfig(), base=release)  # the release is not the base


def test_on_synthetic_nulls_the_base_path_p_value_is_uniform(parts):
    """Random token ids are independent of the key: on the base path the p-values of the permutation test are
    uniform up to their Monte Carlo error (K = 199: p is a multiple of 1/200)."""
    release, base, key, tok = parts
    config = DetectConfig(min_tokens=8, n_permutations=199, tail_bound=False, batch_size=64)
    p = np.array([r.p_value for r in Detector(release, tok, key, config, base=base).detect(random_texts(tok, 400))])
    for level in (0.05, 0.1, 0.25, 0.5):
        rate, sd = (p <= level).mean(), np.sqrt(level * (1 - level) / len(p))
        assert abs(rate - level) < 4 * sd, (level, rate)


def test_detect_takes_the_base_on_the_command_line(retied, tied_dir):
    text = "the river city council voted on a new plan for public parks and schools while farmers reported rain " * 2
    args = ["detect", "--model", str(retied / "model"), "--key", str(retied / "key"), "--min-tokens", "4"]
    result = CliRunner().invoke(app, [*args, "--base", str(tied_dir), "--quiet", "--text", text])
    assert result.exit_code == 0, result.output
    assert '"backbone": "original"' in result.stdout


def test_the_service_takes_the_base_too(retied, tied_dir):
    from fastapi.testclient import TestClient

    from openstamp.cli.serve import build_app
    from openstamp.service import ServiceConfig

    config = DetectConfig(min_tokens=4)
    app = build_app(str(retied / "model"), retied / "key", config, ServiceConfig(), None, base=str(tied_dir))
    text = "the river city council voted on a new plan for public parks and schools while farmers reported rain"
    with TestClient(app) as client:
        (result,) = client.post("/v1/detect", json={"texts": [text]}).json()["results"]
    assert result["backbone"] == "original"


def test_calibrate_takes_the_base_and_detect_warns_on_another_path(retied, tied_dir, corpus_file, tmp_path, caplog):
    import json
    import logging
    import shutil

    key = tmp_path / "key"
    shutil.copytree(retied / "key", key)
    args = ["calibrate", "--model", str(retied / "model"), "--key", str(key), "--corpus", str(corpus_file)]
    args += ["--n", "20", "--length", "24", "--fpr", "0.1", "--quiet", "--part", "all"]
    result = CliRunner().invoke(app, [*args, "--base", str(tied_dir)])
    assert result.exit_code == 0, result.output
    calibration = json.loads((key / "key.json").read_text())["calibration"]
    assert calibration["backbone"] == "original" and calibration["part"] == "all"
    assert calibration["base"] == str(tied_dir) and calibration["n_texts"] == 20
    release = AutoModelForCausalLM.from_pretrained(retied / "model").eval()
    base = AutoModelForCausalLM.from_pretrained(tied_dir).eval()
    config = DetectConfig(calibrated=True, alpha=0.1)
    logger = logging.getLogger("openstamp.detect.detector")
    logger.addHandler(caplog.handler)  # the CLI's logging setup above replaced the root's handlers
    try:
        Detector(release, tokenizer_of(retied), WatermarkKey.load(key), config)
        assert "calibrated on the original backbone" in caplog.text
        caplog.clear()
        Detector(release, tokenizer_of(retied), WatermarkKey.load(key), config, base=base)
        assert "calibrated on" not in caplog.text
    finally:
        logger.removeHandler(caplog.handler)
    bad = CliRunner().invoke(app, [*args[:-3], "--part", "key"])
    assert bad.exit_code == 2 and "--part must be heldout or all" in bad.output


def tokenizer_of(root):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(root / "model")
