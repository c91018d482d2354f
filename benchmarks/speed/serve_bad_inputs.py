"""Bad input against a real detection server: what status each request gets, and that it survives.

    python benchmarks/speed/serve_bad_inputs.py [--model runs/demo/model --key runs/demo/key]

Starts `openstamp serve` on 127.0.0.1 (a free port, a random API key, small limits so that the
oversize cases stay small), sends each request below with httpx, and records the status, the
start of the error message, and whether the submitted text was echoed back. After every request
the server must still answer /healthz, and a good request must still be scored. Writes
benchmarks/results/serve_bad_inputs.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import DEMO, ensure_key, write_result  # noqa: E402
from serve_load import start_server  # noqa: E402

TEXT = (
    "The council said the new bridge would open in spring, after two years of delays caused by floods "
    "and a shortage of steel. Residents have asked for a footpath on both sides."
)
LIMITS = {"max_texts": 8, "max_chars": 2000, "max_request_tokens": 2048, "max_body_mb": 0.25}


def cases(token: str) -> list[tuple[str, dict]]:
    """(description, httpx request arguments) for each bad or borderline request."""
    auth = {"Authorization": f"Bearer {token}"}
    raw = lambda body, headers=None: {"content": body, "headers": {**auth, **(headers or {})}}  # noqa: E731
    js = lambda body: {"json": body, "headers": auth}  # noqa: E731
    return [
        ("no Authorization header", {"json": {"texts": [TEXT]}}),
        ("wrong API key", {"json": {"texts": [TEXT]}, "headers": {"Authorization": "Bearer not-the-key"}}),
        ("Basic instead of Bearer", {"json": {"texts": [TEXT]}, "headers": {"Authorization": "Basic dXNlcg=="}}),
        ("truncated JSON", raw(b'{"texts": ["a"')),
        ("empty body", raw(b"")),
        ("body that is not UTF-8", raw(b"\xff\xfe{}")),
        ("JSON with a non-UTF-8 string", raw(b'{"texts": ["\xc3\x28"]}')),
        ("JSON array instead of an object", js([TEXT])),
        ("texts is a string", js({"texts": TEXT})),
        ("texts holds numbers", js({"texts": [1, 2]})),
        ("texts is null", js({"texts": None})),
        ("unknown field", js({"text": [TEXT]})),
        ("token_scores is not a boolean", js({"texts": [TEXT], "token_scores": "yes"})),
        ("prompts and texts differ in number", js({"texts": [TEXT], "prompts": ["a", "b"]})),
        ("lone UTF-16 surrogate", raw(b'{"texts": ["\\ud800 x"]}', {"Content-Type": "application/json"})),
        (f"{LIMITS['max_texts'] + 1} texts (limit {LIMITS['max_texts']})", js({"texts": [TEXT] * 9})),
        (f"a text over {LIMITS['max_chars']} characters", js({"texts": ["word " * 500]})),
        (f"over {LIMITS['max_request_tokens']} tokens in all", js({"texts": [TEXT * 11] * 8})),
        ("Content-Length of 100 MB (10 bytes sent)", {"lying_length": 100_000_000}),
        ("a body over the size limit", raw(json.dumps({"texts": ["x" * 300_000]}).encode())),
        ("no texts", js({"texts": []})),
        ("empty and too-short texts beside a good one", js({"texts": ["", "hi", TEXT]})),
        ("GET on /v1/detect", {"method": "GET", "headers": auth}),
    ]


def lying_request(url: str, token: str, length: int) -> httpx.Response:
    """A POST that declares ``length`` bytes and sends 10 (httpx refuses to send such a request)."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/detect HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + b'{"texts": ')
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    reply = reply.decode("utf-8", "replace")
    status_line, _, rest = reply.partition("\r\n")
    body = rest.partition("\r\n\r\n")[2]
    return httpx.Response(int(status_line.split()[1]), content=body.encode())


def send(http: httpx.Client, url: str, token: str, name: str, request: dict) -> dict:
    method = request.pop("method", "POST")
    if "lying_length" in request:
        response = lying_request(url, token, request["lying_length"])
    else:
        response = http.request(method, f"{url}/v1/detect", **request)
    try:
        body = response.json()
    except ValueError:
        body = response.text
    detail = body.get("detail") if isinstance(body, dict) else body
    statuses = [r.get("status") for r in body.get("results", [])] if isinstance(body, dict) else []
    alive = http.get(f"{url}/healthz").status_code == 200
    return {
        "request": name,
        "status": response.status_code,
        "item_statuses": statuses,
        "message": json.dumps(detail)[:160] if detail is not None else "",
        "text_echoed": TEXT in response.text,
        "server_alive_after": alive,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEMO / "model")
    parser.add_argument("--key", type=Path, default=DEMO / "key")
    args = parser.parse_args()
    args.max_wait_ms = 10
    ensure_key(args.model, args.key)
    token = secrets.token_urlsafe(24)
    extra = tuple(x for k, v in LIMITS.items() for x in (f"--{k.replace('_', '-')}", str(v)))
    with tempfile.TemporaryDirectory(prefix="serve-bad-") as tmp:
        proc, url = start_server(args, 8, token, Path(tmp) / "server.log", extra)
        try:
            with httpx.Client(timeout=120) as http:
                rows = [send(http, url, token, name, request) for name, request in cases(token)]
                auth = {"Authorization": f"Bearer {token}"}
                good = http.post(f"{url}/v1/detect", json={"texts": [TEXT]}, headers=auth)
            log_text = (Path(tmp) / "server.log").read_text()
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    result = {
        "model": str(args.model),
        "limits": LIMITS,
        "requests": rows,
        "good_request_after_all": good.status_code,
        "server_errors_5xx": sum(r["status"] >= 500 for r in rows),
        "texts_in_server_log": TEXT[:40] in log_text,
        "server_exit_code": proc.returncode,
    }
    write_result("serve_bad_inputs", result)
    print(f"\n{'request':48s}{'status':>7s}  item statuses / message")
    for r in rows:
        shown = ", ".join(map(str, r["item_statuses"])) if r["item_statuses"] else r["message"][:70]
        print(f"{r['request']:48s}{r['status']:7d}  {shown}")
    print(
        f"5xx answers: {result['server_errors_5xx']}; good request afterwards: {good.status_code}; "
        f"texts in the server log: {result['texts_in_server_log']}; server exit code {proc.returncode}"
    )


if __name__ == "__main__":
    main()
