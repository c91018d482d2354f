"""A real uvicorn server on loopback, the Python client, and `openstamp detect --server` / `serve`."""

import importlib
import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from openstamp.cli import app as cli
from openstamp.client import DetectionClient, ServiceError
from openstamp.config import DetectConfig
from openstamp.detect import Detector
from openstamp.service import ApiKeys, ServiceConfig, check_bind, create_app
from openstamp.service.auth import ApiKeys as Keys

TOKEN = "client-token-0123456789abcdef"
TEXT = "scientists measured the glacier and found it shrinking faster than expected the museum opened an exhibit"
runner = CliRunner()


@pytest.fixture(scope="module")
def detector(release):  # the defaults of `openstamp detect`, so both give the same records
    return Detector.from_pretrained(str(release / "model"), str(release / "key"), DetectConfig())


@contextmanager
def serving(app):
    """Run ``app`` with uvicorn on 127.0.0.1 (a free port) in a thread; yield its URL and server."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


@pytest.fixture(scope="module")
def server(detector):
    app = create_app(detector, ServiceConfig(max_texts=8, allow_token_scores=True), ApiKeys.from_lines([TOKEN], "test"))
    with serving(app) as (url, _):
        yield url


def texts_file(tmp_path):
    records = [
        {"id": "a", "text": TEXT, "prompt": "Today"},
        {"id": 7, "text": "too short"},
        {"text": TEXT + " while farmers reported rain across the northern valley"},
        {"id": "d", "text": TEXT.upper()},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_client_gives_the_same_results_as_the_library(server, detector):
    texts = [TEXT, "", TEXT[:12], TEXT + " and again", TEXT.upper(), TEXT[::-1], TEXT * 2]
    prompts = ["Today", None, None, "News:", None, None, None]
    with DetectionClient(server, TOKEN) as client:
        remote = client.detect(texts, prompts)  # one request: the server makes the same detect call
        assert client.info()["key_id"] == client.key_id == detector.key.key_id
        with_tokens = client.detect([TEXT], token_scores=True)[0]
    local = detector.detect(texts, prompts)
    assert [r.to_dict() for r in remote] == [r.to_dict() for r in local]
    assert [r.status for r in remote][:3] == ["ok", "too_short", "too_short"]
    assert len(with_tokens.token_scores) == len(with_tokens.tokens) == with_tokens.n_tokens


def test_cli_with_server_prints_what_local_detection_prints(server, release, tmp_path):
    path = texts_file(tmp_path)
    local = runner.invoke(
        cli,
        [
            "detect",
            str(path),
            "--model",
            str(release / "model"),
            "--key",
            str(release / "key"),
            "--quiet",
            "--token-scores",
        ],
    )
    remote = runner.invoke(
        cli,
        ["detect", str(path), "--server", server, "--token-scores", "--html", str(tmp_path / "e.html")],
        env={"OPENSTAMP_API_TOKEN": TOKEN},
    )
    assert local.exit_code == 0 and remote.exit_code == 0, remote.output
    assert remote.stdout == local.stdout
    assert [json.loads(line)["id"] for line in remote.stdout.splitlines()] == ["a", 7, 2, "d"]
    assert (tmp_path / "e.html").read_text().count("<span title=") >= 10


def test_cli_pools_with_a_server_as_it_does_locally(server, release, tmp_path):
    """`detect --pool/--group-by --server` prints the records local pooling prints (one request per pool)."""
    rows = [{"text": f"{TEXT} and the report number {i} followed", "account": f"a{i % 2}"} for i in range(6)]
    path = tmp_path / "site.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"text": TEXT, "prompt": "Today", "account": 9}]))
    local_args = ["--model", str(release / "model"), "--key", str(release / "key"), "--quiet"]
    env = {"OPENSTAMP_API_TOKEN": TOKEN}
    for args in (["--pool"], ["--group-by", "account", "--dedupe"]):
        local = runner.invoke(cli, ["detect", str(path), *args, *local_args])
        remote = runner.invoke(cli, ["detect", str(path), *args, "--server", server], env=env)
        assert local.exit_code == 0 and remote.exit_code == 0, remote.output
        assert remote.stdout == local.stdout
    pooled = json.loads(runner.invoke(cli, ["detect", str(path), "--pool", "--server", server], env=env).stdout)
    assert pooled["id"] == str(path) and pooled["n_texts"] == 7 and pooled["status"] == "ok"
    grouped = [json.loads(line) for line in remote.stdout.splitlines()]
    assert [(r["id"], r["n_texts"]) for r in grouped] == [("a0", 3), ("a1", 3), (9, 1)]
    assert grouped[0]["detectors"]["dedupe_dropped"] > 0  # the texts share most of their 8-token windows
    many = tmp_path / "many.txt"
    many.write_text("".join(f"{TEXT} {i}\n" for i in range(9)))  # the server takes 8 texts a request
    for args, message in [
        ([str(many), "--pool"], "a pool of 9 texts is more than this service takes in one request (max_texts 8)"),
        ([str(path), "--pool", "--fpr", "0.05"], "--fpr: the server decides these"),
        ([str(path), "--group-by", "account", "--model", "m"], "--model: the server decides these"),
    ]:
        refused = runner.invoke(cli, ["detect", *args, "--server", server], env=env)
        assert refused.exit_code == 2 and message in " ".join(refused.output.split()), refused.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--text", "x"], "give --model and --key"),
        (["--text", "x", "--model", "m"], "give --model and --key"),
        (["--text", "x", "--server", "http://127.0.0.1:1", "--fpr", "0.05"], "--fpr"),
        (
            ["--text", "x", "--server", "http://127.0.0.1:1", "--model", "m", "--min-tokens", "4"],
            "--model, --min",
        ),
    ],
)
def test_cli_refuses_mixing_local_and_server_settings(args, message):
    result = runner.invoke(cli, ["detect", *args])
    assert result.exit_code == 2 and message in result.output


def test_cli_reports_a_wrong_token_as_one_line(server):
    result = runner.invoke(cli, ["detect", "--server", server, "--token", "wrong-token-0123456789", "--text", TEXT])
    assert result.exit_code == 2 and "401" in result.output and "Traceback" not in result.output


def test_shutdown_finishes_accepted_requests(detector, monkeypatch):
    app = create_app(detector, ServiceConfig(), None)
    original = detector.detect

    def slow_detect(*args, **kwargs):
        time.sleep(0.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(detector, "detect", slow_detect)
    answer = {}
    with serving(app) as (url, server):
        thread = threading.Thread(
            target=lambda: answer.update(r=httpx.post(f"{url}/v1/detect", json={"texts": [TEXT]}, timeout=20))
        )
        thread.start()
        deadline = time.monotonic() + 10
        while app.state.batcher.calls == 0:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        server.should_exit = True  # what SIGTERM does
        thread.join(20)
    assert answer["r"].status_code == 200 and answer["r"].json()["results"][0]["status"] == "ok"


# -- the client's retries, against a mock transport ----------------------------------------------

INFO = {"key_id": "k", "limits": {"max_texts": 100}}


def mock_client(handler, **kwargs):
    http = httpx.Client(transport=httpx.MockTransport(handler))
    return DetectionClient("http://svc", TOKEN, http=http, backoff=0.001, **kwargs)


def answer(texts):
    items = [
        {
            "index": i,
            "status": "too_short",
            "n_tokens": len(t),
            "score": None,
            "p_value": None,
            "test": None,
            "decision": None,
            "rule": "r",
            "detectors": {},
            "truncated": False,
        }
        for i, t in enumerate(texts)
    ]
    return {"key_id": "k", "results": items}


def test_client_retries_when_busy_honouring_retry_after():
    seen = []

    def handler(request):
        if request.url.path == "/v1/info":
            return httpx.Response(200, json=INFO)
        seen.append(request.headers["authorization"])
        if len(seen) < 3:
            return httpx.Response(429 if len(seen) == 1 else 503, headers={"Retry-After": "0"}, json={"detail": "busy"})
        return httpx.Response(200, json=answer(json.loads(request.content)["texts"]))

    results = mock_client(handler).detect(["abc", "de"])
    assert [r.n_tokens for r in results] == [3, 2] and seen == [f"Bearer {TOKEN}"] * 3


@pytest.mark.parametrize("max_texts, expected", [(100, [5, 2, 3, 1, 2]), (2, [2, 2, 1])])
def test_client_splits_requests_to_fit_the_limits(max_texts, expected):
    sizes = []

    def handler(request):
        if request.url.path == "/v1/info":
            return httpx.Response(200, json={**INFO, "limits": {"max_texts": max_texts}})
        texts = json.loads(request.content)["texts"]
        sizes.append(len(texts))
        if len(texts) > 2:
            return httpx.Response(413, json={"detail": "the request has too many tokens"})
        return httpx.Response(200, json=answer(texts))

    results = mock_client(handler).detect(["a", "bb", "ccc", "dddd", "eeeee"])
    assert [r.n_tokens for r in results] == [1, 2, 3, 4, 5]
    assert sizes == expected  # halves after a 413, or chunks of the server's max_texts


def test_client_gives_up_with_a_clear_error():
    calls = []

    def handler(request):
        calls.append(request.url.path)
        return httpx.Response(503, json={"detail": "shutting down"})

    with pytest.raises(ServiceError, match="503: shutting down") as err:
        mock_client(handler, retries=2).info()
    assert err.value.status == 503 and len(calls) == 3
    with pytest.raises(ServiceError, match="cannot reach"):
        DetectionClient("http://127.0.0.1:1", TOKEN, retries=1, backoff=0.001).info()


# -- openstamp serve: refusals before anything is loaded, and the app it builds --------------------


def test_serve_refuses_anonymous_access_on_a_public_address(release, monkeypatch):
    monkeypatch.delenv("OPENSTAMP_API_KEYS", raising=False)
    base = ["serve", "--model", str(release / "model"), "--key", str(release / "key")]
    public = runner.invoke(cli, [*base, "--host", "0.0.0.0", "--no-auth"])
    assert public.exit_code == 2 and "--i-know-this-is-public" in public.output
    no_keys = runner.invoke(cli, base)
    assert no_keys.exit_code == 2 and "no API keys" in no_keys.output


def test_serve_builds_an_authenticated_app(release, tmp_path, monkeypatch):
    started = {}
    serve_module = importlib.import_module("openstamp.cli.serve")  # the package re-exports the function
    monkeypatch.setattr(serve_module, "run", lambda app, host, port, connections: started.update(app=app, port=port))
    (tmp_path / "keys.txt").write_text(f"# team keys\n{TOKEN}\n\nsha256:{'0' * 64}\n")
    result = runner.invoke(
        cli,
        [
            "serve",
            "--model",
            str(release / "model"),
            "--key",
            str(release / "key"),
            "--api-keys",
            str(tmp_path / "keys.txt"),
            "--port",
            "9999",
            "--max-texts",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert started["port"] == 9999
    with TestClient(started["app"]) as client:
        assert client.get("/v1/info").status_code == 401
        info = client.get("/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert info["limits"]["max_texts"] == 2 and info["model"] == f"{release.name}/model"


def test_api_keys_and_bind_rules(monkeypatch):
    keys = Keys.from_lines(["# comment", "", TOKEN, "sha256:" + "ab" * 32], "file")
    assert len(keys) == 2 and keys.check(TOKEN) and not keys.check(TOKEN + "x") and not keys.check(None)
    for bad in (["short"], ["sha256:1234"], ["# only a comment"]):
        with pytest.raises(ValueError):
            Keys.from_lines(bad, "file")
    monkeypatch.setenv("OPENSTAMP_API_KEYS", f"{TOKEN},other-token-0123456789")
    assert Keys.from_env().check("other-token-0123456789")
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(host, no_auth=True, public_ok=False)
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.org"):
        with pytest.raises(ValueError, match="i-know-this-is-public"):
            check_bind(host, no_auth=True, public_ok=False)
        check_bind(host, no_auth=True, public_ok=True)
        check_bind(host, no_auth=False, public_ok=False)


def test_client_sends_conversations_in_chunks_with_their_options():
    bodies = []

    def handler(request):
        if request.url.path == "/v1/info":
            return httpx.Response(200, json={**INFO, "limits": {"max_texts": 2}})
        body = json.loads(request.content)
        bodies.append(body)
        data = answer(["x" * len(m) for m in body["messages"]])
        return httpx.Response(200, json={**data, "key_id": None, "key_ids": ["k1", "k2"]})

    chats = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]] * 3
    client = mock_client(handler)
    results = client.detect_messages(chats, drop_reasoning=True)
    assert len(results) == 3 and [len(b["messages"]) for b in bodies] == [2, 1]
    assert all(b["drop_reasoning"] and not b["drop_system"] and "texts" not in b for b in bodies)
    assert client.key_ids == ["k1", "k2"] and client.key_id is None


def test_client_pools_in_one_request_and_explains_a_413():
    bodies = []

    def handler(request):
        if request.url.path == "/v1/info":
            return httpx.Response(200, json={**INFO, "limits": {"max_texts": 3}})
        body = json.loads(request.content)
        bodies.append(body)
        if len(body["texts"]) > 2:
            return httpx.Response(413, json={"detail": "the request has 900 tokens; the limit is 800 per request"})
        data = answer(["".join(body["texts"])])
        data["results"][0]["n_texts"] = len(body["texts"])
        return httpx.Response(200, json=data)

    client = mock_client(handler)
    result = client.detect_pool(["ab", "cde"], dedupe=True)
    assert (result.n_texts, result.n_tokens) == (2, 5)
    assert bodies == [{"texts": ["ab", "cde"], "pool": True, "dedupe": True}]  # no prompts: none were given
    client.detect_pool(["ab", "cd"], ["Today", None])
    assert bodies[-1]["prompts"] == ["Today", None] and bodies[-1]["dedupe"] is False
    with pytest.raises(ServiceError, match="800 per request; a pool is scored in one request") as err:
        client.detect_pool(["a", "b", "c"])
    assert err.value.status == 413 and len(bodies) == 3  # not split: halves would be other pools
    with pytest.raises(ServiceError, match=r"a pool of 4 texts .* \(max_texts 3\)"):
        client.detect_pool(["a", "b", "c", "d"])
    assert len(bodies) == 3
