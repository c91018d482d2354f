"""The README's picture of the detection page: `openstamp serve`'s page on the demo release, with one watermarked
completion pasted in and detected, taken with Playwright driving Debian's Chromium.

    python scripts/page_screenshot.py [--demo runs/demo --out docs/page.png]

Reads what `openstamp demo` wrote (the release, its key and demo.json's samples), serves the release on a free port of
127.0.0.1 behind a one-off API key with per-token scores allowed (``openstamp serve --allow-token-scores``), pastes
the first watermarked completion the detector flags, and writes the page as a PNG (to a temporary file, then renamed).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import threading
import time
from pathlib import Path

from openstamp.config import DetectConfig
from openstamp.detect import Detector
from openstamp.service import ApiKeys, ServiceConfig, create_app


def flagged_sample(demo: Path, detector: Detector) -> str:
    samples = json.loads((demo / "demo.json").read_text(encoding="utf-8"))["samples"]
    texts = [s["watermarked"] for s in samples]
    for text, result in zip(texts, detector.detect(texts), strict=True):
        if result.decision:
            return text
    raise SystemExit(f"no watermarked sample in {demo / 'demo.json'} is flagged; run openstamp demo again")


def serve(app) -> tuple[str, object, threading.Thread]:
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise SystemExit("the server did not start")
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", type=Path, default=Path("runs/demo"), help="what openstamp demo wrote")
    parser.add_argument("--out", type=Path, default=Path("docs/page.png"))
    parser.add_argument("--width", type=int, default=1000)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        raise SystemExit("Chromium is missing: apt-get install chromium (scripts/setup.sh does it as root)")
    if not (args.demo / "demo.json").exists():
        raise SystemExit(f"{args.demo / 'demo.json'} is missing: run openstamp demo first")
    from playwright.sync_api import sync_playwright

    detector = Detector.from_pretrained(str(args.demo / "model"), str(args.demo / "key"), DetectConfig())
    text = flagged_sample(args.demo, detector)
    token = secrets.token_urlsafe(24)
    app = create_app(detector, ServiceConfig(allow_token_scores=True), ApiKeys.from_lines([token], "screenshot"))
    url, server, thread = serve(app)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": args.width, "height": 800})
            page.goto(url + "/")
            page.fill("#key", token)
            page.fill("#text", text)
            page.click("#detect")
            page.wait_for_selector("#result:not([hidden])", timeout=60_000)
            page.eval_on_selector("#text", "box => { box.scrollTop = 0; }")  # the text's start, not its end
            temporary = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp.png")
            page.screenshot(path=str(temporary), full_page=True)
            browser.close()
        os.replace(temporary, args.out)
    finally:
        server.should_exit = True
        thread.join(10)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
