"""The core install detects texts without the optional extras (serve, eval, attacks, corpora, ray, vllm)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXTRAS = ("fastapi", "uvicorn", "peft", "matplotlib", "gensim", "datasets", "ray", "vllm")

# A child interpreter in which the extras cannot be imported and importlib.util.find_spec does not
# find them, as if they were never installed (a None entry in sys.modules does both).
GUARD = textwrap.dedent(
    f"""
    import sys
    for name in {EXTRAS!r}:
        sys.modules[name] = None
    """
)


def run_child(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", GUARD + textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )


def test_detection_runs_without_the_extras(release):
    code = f"""
    import json, sys
    from typer.testing import CliRunner
    from openstamp import Detector
    from openstamp.cli import app

    text = "the river city council voted on a new plan for public parks and schools while farmers reported rain"
    detector = Detector.from_pretrained({str(release / "model")!r}, {str(release / "key")!r})
    api = detector.detect([text])[0]
    args = ["detect", "--model", {str(release / "model")!r}, "--key", {str(release / "key")!r}]
    cli = CliRunner().invoke(app, [*args, "--min-tokens", "4", "--quiet", "--text", text])
    assert cli.exit_code == 0, cli.output
    loaded = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in {EXTRAS!r})
    print(json.dumps({{"api": api.status, "cli": json.loads(cli.stdout)["status"], "loaded": loaded}}))
    """
    child = run_child(code)
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report == {"api": "ok", "cli": "ok", "loaded": []}


@pytest.mark.parametrize(
    "code, message",
    [
        ("from openstamp.corpus import load_documents; load_documents('wikipedia')", "openstamp[corpora]"),
        ("from openstamp.corpus import load_documents; load_documents('hf:x:train:text')", "openstamp[corpora]"),
    ],
)
def test_a_missing_extra_is_named(code, message):
    child = run_child(
        f"""
    from openstamp.errors import MissingExtraError
    try:
        {code}
    except MissingExtraError as err:
        print(err)
    """
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert message in child.stdout


def test_engine_ray_without_ray_names_the_extra(release, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "the river"}\n')
    code = f"""
    from typer.testing import CliRunner
    from openstamp.cli import app
    args = ["detect", "--engine", "ray", "--model", {str(release / "model")!r}, "--key", {str(release / "key")!r}]
    result = CliRunner().invoke(app, [*args, {str(tmp_path / "in.jsonl")!r}, "--out", {str(tmp_path / "o")!r}])
    print(result.exit_code, result.output)
    """
    child = run_child(code)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.startswith("2 ") and "pip install 'openstamp[ray]'" in child.stdout
