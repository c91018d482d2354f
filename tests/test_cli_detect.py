import json

import pytest
from conftest import SMALL_EMBED, fixed_secret
from typer.testing import CliRunner

from openstamp.cli import app

runner = CliRunner()


def run_detect(release, *args):
    return runner.invoke(
        app,
        [
            "detect",
            "--model",
            str(release / "model"),
            "--key",
            str(release / "key"),
            "--min-tokens",
            "4",
            "--quiet",
            *args,
        ],
    )


def test_detect_texts_from_every_input_kind(release, tmp_path):
    text = "the river city council voted on a new plan for public parks and schools while farmers reported rain"
    result = run_detect(release, "--text", text, "--text", "")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["status"] for r in records] == ["ok", "too_short"]
    ok = records[0]
    assert {"score", "n_tokens", "p_value", "test", "decision", "rule", "detectors"} <= set(ok)
    assert ok["p_value"] is not None and 0 < ok["p_value"] <= 1
    (tmp_path / "in.txt").write_text(f"{text}\n{text} again\n")
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "text": text, "prompt": "Today"}) + "\n")
    by_txt = run_detect(release, str(tmp_path / "in.txt"))
    assert by_txt.exit_code == 0 and len(by_txt.stdout.splitlines()) == 2
    by_jsonl = run_detect(release, str(tmp_path / "in.jsonl"), "--token-scores")
    record = json.loads(by_jsonl.stdout)
    assert record["id"] == "a" and len(record["token_scores"]) == record["n_tokens"] == len(record["tokens"])


def test_detect_writes_output_and_html(release, tmp_path):
    text = "scientists measured the glacier and found it shrinking faster than expected the museum opened"
    result = run_detect(
        release, "--text", text, "--output", str(tmp_path / "out.jsonl"), "--html", str(tmp_path / "e.html")
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out.jsonl").read_text())["status"] == "ok"
    page = (tmp_path / "e.html").read_text()
    assert page.count("<span title=") >= 10 and "rgba(" in page


@pytest.mark.parametrize(
    "content, name, message",
    [
        (None, "missing.txt", "does not exist"),
        ("{broken\n", "bad.jsonl", "not valid JSON"),
        ('{"body": "x"}\n', "nofield.jsonl", "needs a string field 'text'"),
        (b"\xff\xfe\xfa", "binary.txt", "not UTF-8"),
    ],
)
def test_bad_input_files_give_clear_errors(release, tmp_path, content, name, message):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    result = run_detect(release, str(path))
    assert result.exit_code == 2 and message in result.output


def test_detect_refuses_the_wrong_key(release, tiny_model_dir, corpus_file, tmp_path):
    other = [
        "embed",
        "--model",
        str(tiny_model_dir),
        "--corpus",
        str(corpus_file),
        "--out",
        str(tmp_path / "model"),
        "--key",
        str(tmp_path / "key"),
        *SMALL_EMBED,
        *fixed_secret(tmp_path, 11),  # another secret than the release's
    ]
    assert runner.invoke(app, other).exit_code == 0
    result = runner.invoke(
        app,
        [
            "detect",
            "--model",
            str(release / "model"),
            "--key",
            str(tmp_path / "key"),
            "--text",
            "some text here",
        ],
    )
    assert result.exit_code == 2 and "wrong key" in result.output
    missing = runner.invoke(
        app, ["detect", "--model", str(release / "model"), "--key", str(tmp_path / "nokey"), "--text", "x"]
    )
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_calibrate_stores_thresholds_used_by_detect(release, corpus_file, tmp_path):
    result = runner.invoke(
        app,
        [
            "calibrate",
            "--model",
            str(release / "model"),
            "--key",
            str(release / "key"),
            "--corpus",
            str(corpus_file),
            "--n",
            "40",
            "--length",
            "32",
            "--fpr",
            "0.05,0.1",
            "--report",
            str(tmp_path / "report"),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    header = json.loads((release / "key" / "key.json").read_text())
    thresholds = header["calibration"]["llr_thresholds"]
    assert set(thresholds) == {"0.05", "0.1"} and thresholds["0.05"] >= thresholds["0.1"]
    assert (tmp_path / "report" / "pvalues_qq.png").stat().st_size > 1000
    text = "the museum opened an exhibit about ancient trade routes and coastal villages while farmers reported"
    flagged = run_detect(release, "--text", text, "--calibrated", "--fpr", "0.05")
    record = json.loads(flagged.stdout)
    assert record["rule"] == f"llr > {thresholds['0.05']:.4g}"
    not_calibrated = run_detect(release, "--text", text, "--calibrated", "--fpr", "0.2")
    assert not_calibrated.exit_code == 2 and "calibrated for alpha" in not_calibrated.output


def _demo(tiny_model_dir, corpus_file, out, *extra):
    settings = ["--model", str(tiny_model_dir), "--corpus", str(corpus_file), "--prompts", str(corpus_file)]
    settings += ["--profile", "small", "--n", "2", "--prompt-tokens", "8", "--new-tokens", "24", "--quiet"]
    return runner.invoke(app, ["demo", "--out", str(out), *settings, *extra])


def test_demo_embeds_generates_and_detects(tiny_model_dir, corpus_file, tmp_path):
    result = _demo(tiny_model_dir, corpus_file, tmp_path / "demo")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert len(record["samples"]) == 2
    sample = record["samples"][0]
    assert set(sample["detection"]) == {"original", "watermarked", "human"}
    assert sample["detection"]["watermarked"]["status"] == "ok"
    assert (tmp_path / "demo" / "model" / "config.json").exists() and (tmp_path / "demo" / "key" / "secret").exists()
    # the summary says what the false-positive rate means for a row of 2 unwatermarked texts: 1 - 0.99^2 = 2%
    assert "a row of 2 such texts has one flagged in about 2% of runs" in " ".join(result.output.split())


def test_the_demo_repeats_with_its_secret_and_not_without(tiny_model_dir, corpus_file, tmp_path):
    def run(name, *extra):
        result = _demo(tiny_model_dir, corpus_file, tmp_path / name, *extra)
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / name / "demo.json").read_text())

    first = run("first")
    again = run("again", "--secret-file", str(tmp_path / "first" / "key" / "secret"))
    other = run("other")
    assert (first["settings"]["secret"], again["settings"]["secret"]) == ("random", "given")
    assert again["settings"]["key_id"] == first["settings"]["key_id"] != other["settings"]["key_id"]
    assert again["samples"] == first["samples"]  # the same texts, scores and p-values
    assert other["samples"] != first["samples"]
