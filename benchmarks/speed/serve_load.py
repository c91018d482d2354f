"""Load test of the detection service on loopback: N concurrent clients for a fixed time, twice.

    python benchmarks/speed/serve_load.py [--model runs/demo/model --key runs/demo/key --clients 8 --duration 60]

Starts `openstamp serve` in a subprocess (127.0.0.1, a free port, a random API key) with
micro-batching, runs the clients against it, stops it, and does it again with max batch 1,
so the batching gain is measured in the same run. Each client sends one held-out text
window (--length tokens) per request, back to back, until the phase's time or request
budget runs out. Reports texts/s, tokens/s, p50/p99 latency, errors and the server's peak
memory (VmHWM). Writes benchmarks/results/serve_load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import DEMO, ensure_key, write_result  # noqa: E402

from openstamp.detect.calibrate import reference_texts  # noqa: E402
from openstamp.model.load import load_tokenizer  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    args, max_batch: int, token: str, log: Path, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str]:
    """Start `openstamp serve` on 127.0.0.1 (``extra``: more CLI options); wait for /healthz."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "openstamp.cli",
        "serve",
        "--model",
        str(args.model),
        "--key",
        str(args.key),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-batch",
        str(max_batch),
        "--max-wait-ms",
        str(args.max_wait_ms),
        *extra,
    ]
    env = {**os.environ, "OPENSTAMP_API_KEYS": token}
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"the server did not start within 300 s; see {log}")


def peak_memory_mb(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            fields[name] = round(int(value.split()[0]) / 1024, 1)
    return fields


async def load(url: str, token: str, texts: list[str], clients: int, duration: float, budget: int) -> dict:
    """``clients`` loops posting one text each until ``duration`` s or ``budget`` requests have gone."""
    latencies, tokens, errors, sent = [], [], [], 0
    headers = {"Authorization": f"Bearer {token}"}

    async def client(http: httpx.AsyncClient, start: int, stop_at: float) -> None:
        nonlocal sent
        i = start
        while time.monotonic() < stop_at and sent < budget:
            sent += 1
            began = time.perf_counter()
            try:
                response = await http.post(f"{url}/v1/detect", json={"texts": [texts[i % len(texts)]]})
                if response.status_code != 200:
                    errors.append(f"{response.status_code}: {response.text[:200]}")
                else:
                    latencies.append(time.perf_counter() - began)
                    tokens.append(response.json()["results"][0]["n_tokens"])
            except httpx.HTTPError as err:
                errors.append(repr(err))
            i += clients

    async with httpx.AsyncClient(headers=headers, timeout=120) as http:
        await asyncio.gather(*(client(http, c, time.monotonic() + 5) for c in range(clients)))  # warm-up
        for samples in (latencies, tokens, errors):
            samples.clear()
        sent = 0
        start = time.perf_counter()
        await asyncio.gather(*(client(http, c, time.monotonic() + duration) for c in range(clients)))
        elapsed = time.perf_counter() - start
    ordered = sorted(latencies)
    return {
        "requests": len(latencies) + len(errors),
        "texts": len(latencies),
        "seconds": round(elapsed, 2),
        "texts_per_second": len(latencies) / elapsed,
        "tokens_per_second": sum(tokens) / elapsed,
        "latency_p50_s": statistics.median(ordered) if ordered else None,
        "latency_p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None,
        "errors": len(errors),
        "error_samples": errors[:5],
    }


def phase(args, texts: list[str], max_batch: int, workdir: Path) -> dict:
    token = secrets.token_urlsafe(24)
    proc, url = start_server(args, max_batch, token, workdir / f"server-batch{max_batch}.log")
    try:
        result = asyncio.run(load(url, token, texts, args.clients, args.duration, args.max_requests))
        result["server_memory_mb"] = peak_memory_mb(proc.pid)
    finally:
        proc.terminate()  # SIGTERM: uvicorn finishes open requests, then exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    result["max_batch"] = max_batch
    result["server_exit_code"] = proc.returncode
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEMO / "model")
    parser.add_argument("--key", type=Path, default=DEMO / "key")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--duration", type=float, default=60, help="seconds of load per phase")
    parser.add_argument("--max-requests", type=int, default=5000, help="request budget per phase")
    parser.add_argument("--max-batch", type=int, default=32, help="the batched phase's max batch")
    parser.add_argument("--max-wait-ms", type=float, default=10)
    parser.add_argument("--texts", type=int, default=96, help="distinct held-out texts")
    parser.add_argument("--length", type=int, default=200, help="tokens per text")
    args = parser.parse_args()
    ensure_key(args.model, args.key)
    header = json.loads((args.key / "key.json").read_text())
    used = {d["sha256"] for d in header.get("corpus", {}).get("documents", [])}
    texts = reference_texts(load_tokenizer(str(args.model)), ["wikipedia", "news"], args.texts, args.length, used)
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        batched = phase(args, texts, args.max_batch, Path(tmp))
        single = phase(args, texts, 1, Path(tmp))
    gain = batched["texts_per_second"] / single["texts_per_second"] if single["texts_per_second"] else None
    write_result(
        "serve_load",
        {
            "model": str(args.model),
            "clients": args.clients,
            "duration_s": args.duration,
            "max_wait_ms": args.max_wait_ms,
            "text_tokens": args.length,
            "n_distinct_texts": len(texts),
            "loopback_only": True,
            "batched": batched,
            "max_batch_1": single,
            "batching_gain": gain,
            "errors": batched["errors"] + single["errors"],
        },
    )
    print(f"\n{'':14s}{'texts/s':>9s}{'tokens/s':>10s}{'p50 s':>8s}{'p99 s':>8s}{'errors':>8s}{'VmHWM MB':>10s}")
    for name, r in (("batched", batched), ("max batch 1", single)):
        print(
            f"{name:14s}{r['texts_per_second']:9.2f}{r['tokens_per_second']:10.0f}{r['latency_p50_s']:8.2f}"
            f"{r['latency_p99_s']:8.2f}{r['errors']:8d}{r['server_memory_mb'].get('VmHWM', 0):10.0f}"
        )
    print(f"micro-batching gain: {gain:.2f}x throughput at {args.clients} clients")


if __name__ == "__main__":
    main()
