"""Bad input that used to get through (issue #80), one table of cases run through the CLI, the Python API and
the service; then random bytes and JSON fed to the key loader, the jsonl reader and POST /v1/detect.

Each case checks the exit code (or HTTP status), the first line of the message, and that nothing was written.
"""

import importlib
import json
import logging
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers.utils.logging import enable_progress_bar
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.cli.common import USER_ERRORS, out
from openstamp.cli.detect import print_table, read_inputs
from openstamp.config import DetectConfig
from openstamp.detect import Detector
from openstamp.errors import InvalidKeyError
from openstamp.key import WatermarkKey
from openstamp.release.audit import audit
from openstamp.service import ServiceConfig, create_app

runner = CliRunner()
HUMAN = "the river city council voted on a new plan for public parks and schools while farmers reported rain"
FUZZ = settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
untied = pytest.mark.parametrize("tiny_model_dir", ["untied"], indirect=True)  # one release is enough here


# -- the bad inputs, each made in a fresh folder from the tiny release -----------------------------------------


def backup_copy(tmp: Path, release: Path, base: Path, name: str) -> dict:
    """A release folder that also ships the base's weights (the original U) under another file name."""
    shutil.copytree(release / "model", tmp / "model")
    shutil.copy(base / "model.safetensors", tmp / "model" / name)
    return {"model": tmp / "model", "key": release / "key"}


def nan_head(tmp: Path, release: Path, base: Path) -> dict:
    """A release whose head holds NaN rows (corrupted bytes), to be scored with --force."""
    shutil.copytree(release / "model", tmp / "model")
    path = tmp / "model" / "model.safetensors"
    tensors = load_file(str(path))
    tensors["lm_head.weight"][:40] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})
    return {"model": tmp / "model", "key": release / "key"}


def forged_calibration(tmp: Path, release: Path, base: Path) -> dict:
    """The key with a calibration record added by hand: a threshold under every human text's score."""
    shutil.copytree(release / "key", tmp / "key")
    header = json.loads((tmp / "key" / "key.json").read_text())
    header["calibration"] = {"llr_thresholds": {"0.01": -1.0}}
    (tmp / "key" / "key.json").write_text(json.dumps(header))
    return {"model": release / "model", "key": tmp / "key"}


def edited_config(tmp: Path, release: Path, base: Path) -> dict:
    shutil.copytree(release / "key", tmp / "key")
    header = json.loads((tmp / "key" / "key.json").read_text())
    header["config"]["green"]["delta"] = 9.0
    (tmp / "key" / "key.json").write_text(json.dumps(header))
    return {"model": release / "model", "key": tmp / "key"}


def truncated_weights(tmp: Path, release: Path, base: Path) -> dict:
    shutil.copytree(release / "model", tmp / "model")
    path = tmp / "model" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    return {"model": tmp / "model", "key": release / "key"}


def plain(tmp: Path, release: Path, base: Path) -> dict:
    return {"model": release / "model", "key": release / "key"}


@dataclass
class Case:
    """One bad input and what each surface must answer; None: the surface does not apply."""

    name: str
    make: Callable[[Path, Path, Path], dict]
    command: str  # detect, serve or audit
    args: list[str] = field(default_factory=list)
    stdin: str | None = None
    exit_code: int = 2
    first_line: str = ""  # the start of the first line of stderr (exit != 0) or of the first finding
    api: Callable[[dict], object] | None = None  # raises, or returns what check_api inspects
    api_error: tuple[type, str] | None = None
    check_api: Callable[[object], bool] | None = None
    http: int | None = None  # POST /v1/detect of HUMAN on a service over the case's detector
    check_http: Callable[[dict], bool] | None = None


def copy_of_u(findings) -> bool:
    highs = [f for f in findings if f.severity == "high"]
    return any(f.check == "copy of U" for f in highs) and not any("carries no watermark" in f.message for f in highs)


def not_finite(result: dict) -> bool:
    return result["status"] == "not_finite" and result["p_value"] is None and result["decision"] is None


CASES = [
    Case(
        "backup-weights beside model.safetensors",
        lambda t, r, b: backup_copy(t, r, b, "backup-weights.safetensors"),
        "audit",
        exit_code=1,
        first_line="backup-weights.safetensors:lm_head.weight is the original, unwatermarked head",
        api=lambda p: audit(p["model"], p["key"]),
        check_api=copy_of_u,
    ),
    Case(
        "a backup named to sort after model.safetensors",
        lambda t, r, b: backup_copy(t, r, b, "zz-backup.safetensors"),
        "audit",
        exit_code=1,
        first_line="zz-backup.safetensors:lm_head.weight is the original, unwatermarked head",
        api=lambda p: audit(p["model"], p["key"]),
        check_api=copy_of_u,
    ),
    Case(
        "a NaN head scored with --force",
        nan_head,
        "detect",
        ["--force", "--text", HUMAN],
        exit_code=0,
        first_line='{"id": 0, "status": "not_finite"',
        api=lambda p: (
            Detector.from_pretrained(str(p["model"]), str(p["key"]), DetectConfig(min_tokens=4, check_key=False))
            .detect([HUMAN])[0]
            .to_dict()
        ),
        check_api=not_finite,
        http=200,
        check_http=not_finite,
    ),
    Case(
        "a calibration record added to key.json",
        forged_calibration,
        "detect",
        ["--rule", "llr", "--text", HUMAN],
        first_line="error: key",
        api=lambda p: WatermarkKey.load(p["key"]),
        api_error=(InvalidKeyError, "key.json was edited"),
    ),
    Case(
        "the config block of key.json edited",
        edited_config,
        "serve",
        first_line="error: key",
        api=lambda p: WatermarkKey.load(p["key"]),
        api_error=(InvalidKeyError, "key.json was edited"),
    ),
    Case(
        "a truncated model.safetensors (detect)",
        truncated_weights,
        "detect",
        ["--text", HUMAN],
        first_line="error: could not load model",
        api=lambda p: Detector.from_pretrained(str(p["model"]), str(p["key"])),
        api_error=(ValueError, "could not load model"),
    ),
    Case("a truncated model.safetensors (serve)", truncated_weights, "serve", first_line="error: could not load model"),
    Case(
        "a truncated model.safetensors (audit)",
        truncated_weights,
        "audit",
        first_line="error:",
        api=lambda p: audit(p["model"], p["key"]),
        api_error=(ValueError, "is not a readable safetensors file"),
    ),
    Case("an empty jsonl", plain, "detect", ["{tmp}/empty.jsonl"], first_line="error: no texts to score"),
    Case("empty stdin", plain, "detect", ["-"], stdin="", first_line="error: no texts to score: stdin is empty"),
    Case("--output is a directory", plain, "detect", ["--text", HUMAN, "-o", "{tmp}"], first_line="error: --output"),
    Case("--output exists", plain, "detect", ["--text", HUMAN, "-o", "{tmp}/old.jsonl"], first_line="error: --output"),
    Case(
        "--output in a missing folder",
        plain,
        "detect",
        ["--text", HUMAN, "-o", "{tmp}/nowhere/out.jsonl"],
        first_line="error: --output",
    ),
]


def cli_args(case: Case, paths: dict, tmp: Path) -> list[str]:
    args = [a.replace("{tmp}", str(tmp)) for a in case.args]
    if case.command == "audit":
        return ["audit", str(paths["model"]), "--key", str(paths["key"]), "--json"]
    where = ["--model", str(paths["model"]), "--key", str(paths["key"])]
    if case.command == "serve":
        return ["serve", *where, "--no-auth", "--port", "0"]
    return ["detect", *where, "--min-tokens", "4", "--quiet", *args]


def first_line(result, case: Case) -> str:
    if result.stderr.strip():
        return result.stderr.strip().splitlines()[0]
    if case.command == "audit":
        return json.loads(result.stdout)["findings"][0]["message"]
    return result.stdout.splitlines()[0]


def snapshot(folder: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*")}


@untied
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, release, tiny_model_dir, tmp_path, monkeypatch):
    # a serve that gets as far as serving fails the case instead of hanging
    monkeypatch.setattr(importlib.import_module("openstamp.cli.serve"), "run", lambda *args: None)
    made = tmp_path / "made"
    made.mkdir()
    paths = case.make(made, release, tiny_model_dir)
    work = tmp_path / "work"
    work.mkdir()
    (work / "empty.jsonl").write_text("")
    (work / "old.jsonl").write_text("keep me\n")
    before = snapshot(work)
    # the CLI
    result = runner.invoke(app, cli_args(case, paths, work), input=case.stdin)
    assert result.exit_code == case.exit_code, result.output
    assert first_line(result, case).startswith(case.first_line), result.output
    assert "Traceback" not in result.output
    assert snapshot(work) == before  # nothing written, nothing half-written
    # the Python API
    if case.api is not None and case.api_error is not None:
        with pytest.raises(case.api_error[0], match=case.api_error[1]) as err:
            case.api(paths)
        assert "\n" not in str(err.value)
    elif case.api is not None:
        assert case.check_api(case.api(paths))
    # the service, over the same detector
    if case.http is not None:
        detector = Detector.from_pretrained(
            str(paths["model"]), str(paths["key"]), DetectConfig(min_tokens=4, check_key=False)
        )
        with TestClient(create_app(detector, ServiceConfig())) as client:
            response = client.post("/v1/detect", json={"texts": [HUMAN]})
        assert response.status_code == case.http, response.text
        assert case.check_http(response.json()["results"][0])


# -- the smaller items -------------------------------------------------------------------------------------------


@untied
def test_overwrite_replaces_and_truncation_is_noted(release, tmp_path):
    (tmp_path / "old.jsonl").write_text("keep me\n")
    where = ["detect", "--model", str(release / "model"), "--key", str(release / "key"), "--min-tokens", "4"]
    result = runner.invoke(app, [*where, "--quiet", "--text", HUMAN, "-o", str(tmp_path / "old.jsonl"), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "old.jsonl").read_text())["status"] == "ok"
    enable_progress_bar()  # --quiet turned the bars off for this process
    short = runner.invoke(app, [*where, "--text", HUMAN, "--max-tokens", "12"])
    assert short.exit_code == 0, short.output
    assert "Loading weights" in short.stderr  # without --quiet the bar shows; with it (above) it does not
    assert "Loading weights" not in result.stderr
    assert "note: 1 of 1 texts were truncated to 12 tokens" in short.stderr
    assert json.loads(short.stdout)["truncated"] is True


@untied
def test_an_old_key_loads_with_a_warning(release, tmp_path, caplog):
    """A key written before checksum_version 2: its checksum covers the model record only."""
    shutil.copytree(release / "key", tmp_path / "key")
    path = tmp_path / "key" / "key.json"
    header = json.loads(path.read_text())
    del header["checksum_version"]
    key = WatermarkKey.load(release / "key")
    header["checksum"] = key.checksum(1)
    path.write_text(json.dumps(header))
    with caplog.at_level(logging.WARNING):
        assert WatermarkKey.load(tmp_path / "key").key_id == key.key_id
    assert "does not cover its calibration or config" in caplog.text
    header["checksum_version"] = 7
    path.write_text(json.dumps(header))
    with pytest.raises(InvalidKeyError, match="checksum_version 7"):
        WatermarkKey.load(tmp_path / "key")


def test_version_and_help():
    from openstamp import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"openstamp {__version__}"
    help_text = runner.invoke(app, ["detect", "--help"]).stdout
    assert "[ray]" in help_text and "needs the  extra" not in " ".join(help_text.split("│"))


def test_serve_checks_its_port_before_announcing_it(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["serve", "--model", str(tmp_path), "--key", str(tmp_path), "--no-auth", "--port", str(port)]
        result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}")
    assert "http://" not in result.output


def test_the_table_footer_lists_the_decision_rules():
    records = [
        {"id": 0, "status": "ok", "n_tokens": 40, "score": 0.1, "p_value": 0.2, "decision": False, "rule": "p <= 0.01"},
        {"id": 1, "status": "too_short", "n_tokens": 2, "score": None, "p_value": None, "decision": None,
         "rule": "needs at least 16 scored tokens"},
    ]  # fmt: skip
    with out.capture() as captured:
        print_table(records)
    assert "decision rule: p <= 0.01" in captured.get() and "needs at least" not in captured.get().split("rule:")[-1]


# -- fuzzing: random bytes and JSON never give a traceback or a 5xx ------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@untied
@FUZZ
@given(data=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()), merge=st.booleans())
def test_the_key_loader_refuses_random_headers_cleanly(release, tmp_path_factory, data, merge):
    folder = tmp_path_factory.mktemp("fuzzkey")
    shutil.copytree(release / "key", folder / "key", dirs_exist_ok=True)
    path = folder / "key" / "key.json"
    value = json.loads(data) if merge and data[:1] == b"{" else None
    if isinstance(value, dict):  # random fields laid over a valid header
        path.write_text(json.dumps({**json.loads(path.read_text()), **value}))
    else:
        path.write_bytes(data)
    try:
        WatermarkKey.load(folder / "key")
    except InvalidKeyError as err:
        assert "\n" not in str(err)


@FUZZ
@given(data=st.binary(max_size=300) | st.lists(JSON, max_size=4).map(lambda v: "\n".join(map(json.dumps, v)).encode()))
def test_the_jsonl_reader_gives_texts_or_a_user_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzzjsonl") / "in.jsonl"
    path.write_bytes(data)
    try:
        texts, prompts, ids = read_inputs(path, None)
    except USER_ERRORS as err:
        assert str(err)
    else:
        assert len(texts) == len(prompts) == len(ids) and all(isinstance(t, str) for t in texts)


@pytest.fixture(scope="module")
def client(release):
    detector = Detector.from_pretrained(str(release / "model"), str(release / "key"), DetectConfig(min_tokens=4))
    with TestClient(create_app(detector, ServiceConfig(max_texts=4, max_chars=400))) as test_client:
        yield test_client


@untied
@FUZZ
@given(body=st.binary(max_size=200) | JSON.map(json.dumps) | st.lists(st.text(max_size=60), max_size=3).map(
    lambda texts: json.dumps({"texts": texts})
))  # fmt: skip
def test_the_service_never_answers_random_bodies_with_a_5xx(client, body):
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    response = client.post("/v1/detect", content=data, headers={"Content-Type": "application/json"})
    assert response.status_code in (200, 400, 413, 422), response.text
