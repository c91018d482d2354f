"""The detection page at GET /: public static files, and a real browser (Playwright driving Debian's
Chromium) against a real server on 127.0.0.1 with an API key."""

import json
import os
import re
import shutil
import socket
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import SMALL_EMBED, fixed_secret
from fastapi.testclient import TestClient
from transformers import LogitsProcessor
from typer.testing import CliRunner

from openstamp.config import DetectConfig
from openstamp.detect import Detector
from openstamp.model.generate import sample_completions
from openstamp.service import ApiKeys, ServiceConfig, create_app
from openstamp.service.page import STATIC

TOKEN = "page-test-token-0123456789"
HUMAN = (
    "The city council voted on a new plan for public parks and schools, while farmers reported rain across "
    "the northern valley. Scientists measured the glacier and found it shrinking faster than expected."
)
STATIC_DIR = Path(__file__).parents[1] / "src/openstamp/service/static"
# one tiny model is enough here: the release fixture then runs once, not once per tied/untied model
pytestmark = pytest.mark.parametrize("tiny_model_dir", ["untied"], indirect=True)


@pytest.fixture(scope="module")
def release(tiny_model_dir, corpus_file, tmp_path_factory) -> Path:
    """conftest's tiny release with a stronger watermark (delta 3), so that 64-token samples get flagged."""
    from openstamp.cli import app

    root = tmp_path_factory.mktemp("page-release")
    args = ["embed", "--model", str(tiny_model_dir), "--corpus", str(corpus_file)]
    args += ["--out", str(root / "model"), "--key", str(root / "key"), *SMALL_EMBED, "--set", "green.delta=3.0"]
    args += [*fixed_secret(root, 7), "--seed", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def detector(release):
    return Detector.from_pretrained(str(release / "model"), str(release / "key"), DetectConfig(min_tokens=16))


@pytest.fixture(scope="module")
def app(detector):
    keys = ApiKeys.from_lines([TOKEN], "test")
    return create_app(detector, ServiceConfig(allow_token_scores=True), keys, model_name="tiny/release")


def test_the_page_and_its_files_are_public_but_the_api_is_not(app):
    with TestClient(app) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        assert (
            '<script src="/static/page.js"' in page.text
            and "default-src 'self'" in page.headers["content-security-policy"]
        )
        for name, kind in (("page.css", "text/css"), ("page.js", "text/javascript")):
            response = client.get(f"/static/{name}")
            assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
            assert response.headers["x-content-type-options"] == "nosniff"
        assert client.get("/static/../app.py").status_code in (401, 404)  # nothing else is public
        assert client.get("/static/secret.txt").status_code == 401
        assert client.post("/v1/detect", json={"texts": ["the river"]}).status_code == 401
        assert client.get("/v1/info").status_code == 401
        assert "/" not in client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()["paths"]
    assert set(STATIC) | {"index.html"} == {p.name for p in STATIC_DIR.iterdir()}
    for path in STATIC_DIR.iterdir():  # no CDN, no framework: small files that load nothing from elsewhere
        text = path.read_text()
        assert "http://" not in text and "https://" not in text and len(text) < 8000, path.name
    assert "innerHTML" not in (STATIC_DIR / "page.js").read_text()  # user text goes through textContent


class WholeWords(LogitsProcessor):
    """Sample only tokens that are one lower-case word after a space (" the", " and"), so that the decoded
    text tokenizes back to the same ids: the tiny random model's free samples would not."""

    def __init__(self, tokenizer) -> None:
        words = [t for t in range(len(tokenizer)) if re.fullmatch(r" [a-z]+", tokenizer.decode([t]))]
        self.allowed = [t for t in words if tokenizer(tokenizer.decode([t]), add_special_tokens=False).input_ids == [t]]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        keep = torch.full_like(scores, float("-inf"))
        keep[:, self.allowed] = 0
        return scores + keep


@pytest.fixture(scope="module")
def texts(release, detector):
    """A watermarked completion that the detector flags, and a human text that it does not."""
    tok = detector.tokenizer
    prompts = [tok(" the river city", add_special_tokens=False).input_ids] * 8
    samples = sample_completions(
        detector.model, tok, prompts, 48, seed=0, logits_processor=WholeWords(tok), progress=False
    )
    watermarked = [tok.decode(ids) for ids in samples]
    results = detector.detect([*watermarked, HUMAN])
    flagged = [t for t, r in zip(watermarked, results[:-1], strict=True) if r.decision]
    assert flagged and results[-1].decision is False, [(r.score, r.p_value) for r in results]
    return flagged[0], HUMAN


@pytest.fixture(scope="module")
def server(app):
    """The app under uvicorn on a free port of 127.0.0.1, in a thread: a browser needs a real server."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def chromium_or_skip() -> str:
    """Debian's Chromium; skipped (with the reason shown as a warning) only outside CI."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package (pip install -e '.[dev]')"
    else:
        missing = None if path else "Chromium (apt-get install chromium; scripts/setup.sh does it as root)"
    if missing is None:
        return path
    reason = f"the page test needs {missing}"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}")
    warnings.warn(f"skipped: {reason}", UserWarning, stacklevel=2)
    pytest.skip(reason)


def test_the_page_in_a_browser(server, texts, tmp_path):
    chromium = chromium_or_skip()
    from playwright.sync_api import expect, sync_playwright

    watermarked, human = texts
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.set_default_timeout(15_000)
        page.goto(server + "/")
        expect(page.locator("#about")).to_contain_text("needs an API key")

        def detect(text: str, status: int = 200) -> None:
            page.fill("#text", text)
            with page.expect_response("**/v1/detect") as response:
                page.click("#detect")
            assert response.value.status == status
            expect(page.locator("#detect")).to_be_enabled()

        page.fill("#key", TOKEN)
        detect(watermarked)
        expect(page.locator("#verdict")).to_have_text("Flagged: watermarked")
        facts = page.locator("#facts").inner_text()
        assert "p-value" in facts and "mean LLR" in facts and "scored tokens" in facts
        spans = page.locator("#tokens span.tok")
        assert spans.count() >= 16 and "".join(spans.all_text_contents()) in watermarked
        assert "LLR" in spans.first.get_attribute("title") and "rgba" in spans.first.get_attribute("style")
        expect(page.locator("#about")).to_contain_text("tiny/release")
        screenshot = tmp_path / "page.png"
        page.screenshot(path=screenshot, full_page=True)
        print(f"screenshot: {screenshot}")

        detect(human)
        expect(page.locator("#verdict")).to_have_text("Not flagged")
        assert page.locator("#tokens span.tok").count() >= 16

        detect("the river city council")
        expect(page.locator("#message")).to_have_text(
            re.compile(r"Text too short: \d+ tokens scored, at least 16 needed\.")
        )
        assert page.locator("#result").is_hidden()

        page.fill("#key", "a-wrong-key-0123456789")
        detect(human, status=401)
        expect(page.locator("#message")).to_contain_text("API key rejected")
        assert page.locator("#result").is_hidden()
        browser.close()
    assert screenshot.stat().st_size > 10_000


def open_page(p, server: str):
    """Chromium on the page, with the API key filled in and the pooled form opened."""
    browser = p.chromium.launch(executable_path=chromium_or_skip(), args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1000, "height": 900})
    page.set_default_timeout(15_000)
    page.goto(server + "/")
    page.fill("#key", TOKEN)
    page.click("#pool summary")
    return browser, page


def facts(page) -> dict[str, str]:
    names, values = page.locator("#facts dt").all_text_contents(), page.locator("#facts dd").all_text_contents()
    return dict(zip(names, values, strict=True))


def test_the_page_pools_a_set_of_texts(server, texts, detector, tmp_path):
    chromium_or_skip()
    from playwright.sync_api import expect, sync_playwright

    watermarked, human = texts
    expected = detector.detect_pool([watermarked, human], ["Today", None])
    twice = detector.detect_pool([watermarked, watermarked], dedupe=True)
    path = tmp_path / "set.jsonl"  # blank lines and other fields are fine, as for `detect --pool`
    path.write_text(
        f"{json.dumps({'id': 'a', 'text': watermarked, 'prompt': 'Today'})}\n\n{json.dumps({'text': human})}\n"
    )
    with sync_playwright() as p:
        browser, page = open_page(p, server)

        def detect_set() -> dict:
            with page.expect_response("**/v1/detect") as response:
                page.click("#pool-detect")
            assert response.value.status == 200
            expect(page.locator("#pool-detect")).to_be_enabled()
            expect(page.locator("#result")).to_be_visible()
            return response.value.request.post_data_json

        page.set_input_files("#pool-file", str(path))
        sent = detect_set()
        assert sent == {"texts": [watermarked, human], "prompts": ["Today", None], "pool": True, "dedupe": False}
        expect(page.locator("#verdict")).to_have_text("Flagged: watermarked" if expected.decision else "Not flagged")
        shown = facts(page)
        assert shown["texts"] == "2" and shown["scored tokens"] == str(expected.n_tokens)
        assert float(shown["p-value"]) == pytest.approx(expected.p_value, rel=1e-2)
        assert "repeats dropped" not in shown and "pooled p" in shown["rule"]
        assert page.locator("#tokens span.tok").count() == 0 and page.locator("#legend").is_hidden()

        page.set_input_files("#pool-file", [])  # pasted texts, one per blank-line-separated block
        page.fill("#pool-text", f"{watermarked}\n\n\n{watermarked}")
        page.check("#dedupe")
        assert detect_set() == {"texts": [watermarked, watermarked], "pool": True, "dedupe": True}
        shown = facts(page)
        assert shown["texts"] == "2" and shown["scored tokens"] == str(twice.n_tokens)
        assert shown["repeats dropped"] == str(twice.detectors["dedupe_dropped"]) != "0"
        browser.close()


def test_the_page_says_what_is_wrong_with_a_set(server, tmp_path):
    chromium_or_skip()
    from playwright.sync_api import expect, sync_playwright

    files = {
        "notes.txt": b"just some words\nand more\n",
        "missing.jsonl": b'{"text": "a fine text"}\n{"id": 3}\n',
        "prompt.jsonl": b'{"text": "a fine text", "prompt": 7}\n',
        "blank.jsonl": b"\n  \n",
        "binary.jsonl": bytes([0xFF, 0xFE, 0x00, 0x81]),
        "many.jsonl": "".join(json.dumps({"text": f"text {i}"}) + "\n" for i in range(65)).encode(),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    with sync_playwright() as p:
        browser, page = open_page(p, server)
        requests = []
        page.on("request", lambda request: requests.append(request) if "/v1/detect" in request.url else None)

        def refused(message: str, file: str | None = None, pasted: str = "") -> None:
            page.evaluate("document.getElementById('message').textContent = ''")  # no stale match
            page.set_input_files("#pool-file", [tmp_path / file] if file else [])
            page.fill("#pool-text", pasted)
            page.click("#pool-detect")
            expect(page.locator("#message")).to_contain_text(message)
            expect(page.locator("#message")).to_have_class("error")
            expect(page.locator("#pool-detect")).to_be_enabled()
            assert page.locator("#result").is_hidden()

        refused("No texts: paste texts separated by a blank line")
        refused("No texts", pasted="\n\n   \n")
        refused("notes.txt:1 is not valid JSON", "notes.txt")
        refused('missing.jsonl:2 needs a string field "text"', "missing.jsonl")
        refused('prompt.jsonl:1 field "prompt" must be a string', "prompt.jsonl")
        refused("No texts", "blank.jsonl")
        refused("binary.jsonl is not UTF-8 text", "binary.jsonl")
        refused("not both", "missing.jsonl", pasted="a pasted text")
        assert requests == []  # all of these are caught before anything is sent
        refused("Too large for this server: 65 texts in one request; the limit is 64", "many.jsonl")
        assert len(requests) == 1
        browser.close()


def test_the_page_gives_one_verdict_per_group(server, texts, detector, tmp_path):
    chromium_or_skip()
    from playwright.sync_api import expect, sync_playwright

    watermarked, human = texts
    expected = {"a": detector.detect_pool([watermarked, human]), "7": detector.detect_pool([human])}
    path = tmp_path / "accounts.jsonl"  # values are strings or numbers, in order of first appearance
    records = [{"account": "a", "text": watermarked}, {"account": 7, "text": human}, {"account": "a", "text": human}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    partly = [{"account": "a", "text": human}, {"text": human}]
    (tmp_path / "partly.jsonl").write_text("\n".join(json.dumps(r) for r in partly))
    with sync_playwright() as p:
        browser, page = open_page(p, server)
        sent = []
        page.on("request", lambda r: sent.append(r.post_data_json) if "/v1/detect" in r.url else None)
        page.fill("#group-by", "account")
        page.set_input_files("#pool-file", str(path))
        page.click("#pool-detect")
        expect(page.locator("#group-results")).to_be_visible()
        expect(page.locator("#pool-detect")).to_be_enabled()
        assert sent == [
            {"texts": [watermarked, human], "pool": True, "dedupe": False},
            {"texts": [human], "pool": True, "dedupe": False},
        ]  # one request per group: each group is one test
        assert page.locator("#result").is_hidden() and page.locator("#groups-head").text_content() == "account"
        rows = [r.locator("td").all_text_contents() for r in page.locator("#groups tbody tr").all()]
        assert [r[:3] for r in rows] == [[g, str(e.n_texts), str(e.n_tokens)] for g, e in expected.items()]
        for row, result in zip(rows, expected.values(), strict=True):
            assert float(row[3]) == pytest.approx(result.p_value, rel=1e-2)
            assert row[4] == ("flagged" if result.decision else "not flagged")
        flagged = sum(bool(r.decision) for r in expected.values())
        expect(page.locator("#groups-note")).to_contain_text(f"{flagged} of 2 groups flagged")

        sent.clear()
        page.set_input_files("#pool-file", str(tmp_path / "partly.jsonl"))
        page.click("#pool-detect")
        expect(page.locator("#message")).to_contain_text('partly.jsonl:2 needs a field "account"')
        page.set_input_files("#pool-file", [])
        page.fill("#pool-text", human)
        page.click("#pool-detect")
        expect(page.locator("#message")).to_contain_text("Grouping reads a field of a .jsonl file")
        assert sent == [] and page.locator("#group-results").is_hidden()
        browser.close()
