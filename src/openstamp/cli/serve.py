"""openstamp serve: run the detection API for one model and its private key (or several keys)."""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import (
    CacheOption,
    DeviceOption,
    DtypeOption,
    console,
    friendly_errors,
    setup_logging,
)


@friendly_errors
def serve(
    model: str = typer.Option(..., "--model", "-m", help="the watermarked checkpoint (or the original model)"),
    base: str | None = typer.Option(
        None, help="the original model beside the release: its backbone reads the texts (the exact p-value path)"
    ),
    key: list[Path] = typer.Option(
        ...,
        "--key",
        "-k",
        help="the private key directory (stays on this machine); repeat it to serve several keys of this model "
        "(Holm-adjusted p-values, best_key; give the original model when the keys are of different releases)",
    ),
    host: str = typer.Option("127.0.0.1", help="address to bind"),
    port: int = typer.Option(8080, help="port to bind"),
    api_keys: Path | None = typer.Option(
        None, help="file of accepted API keys, one per line (default: $OPENSTAMP_API_KEYS, comma-separated)"
    ),
    no_auth: bool = typer.Option(False, "--no-auth", help="accept anonymous requests (local use only)"),
    public: bool = typer.Option(
        False, "--i-know-this-is-public", help="allow --no-auth on an address other machines can reach"
    ),
    fpr: float = typer.Option(0.01, help="false-positive rate of the decision"),
    threshold: float | None = typer.Option(None, help="flag when the mean LLR exceeds this instead"),
    calibrated: bool = typer.Option(False, help="flag with the key's calibrated LLR threshold for --fpr"),
    min_tokens: int = typer.Option(16, help="shorter texts are reported as too short"),
    max_tokens: int = typer.Option(2048, help="longer texts are truncated to this many tokens"),
    permutations: int = typer.Option(999, help="permutations for the p-value"),
    max_texts: int = typer.Option(64, help="texts per request (more: 413)"),
    max_chars: int = typer.Option(20_000, help="characters per text or prompt (more: 413)"),
    max_request_tokens: int = typer.Option(65_536, help="tokens per request (more: 413)"),
    max_body_mb: float = typer.Option(4.0, help="request body size in MiB (more: 413)"),
    max_batch: int = typer.Option(32, help="texts per shared forward pass"),
    max_wait_ms: float = typer.Option(10.0, help="how long a request waits for others to share its batch"),
    max_queue: int = typer.Option(64, help="requests waiting for a batch (more: 429)"),
    max_connections: int = typer.Option(256, help="open connections; more are refused with 503"),
    log_texts: bool = typer.Option(False, help="log the start of each text (off by default)"),
    allow_token_scores: bool = typer.Option(
        False, help="serve per-token scores (they reveal the watermark logit of each token to callers)"
    ),
    verify_root: list[Path] | None = typer.Option(
        None, help="a directory whose checkpoints POST /v1/verify-model may read (repeatable; none: the route is off)"
    ),
    verify_base: str | None = typer.Option(None, help="the original model POST /v1/verify-model compares against"),
    dtype: str = DtypeOption,
    device: str = DeviceOption,
    cache_dir: Path | None = CacheOption,
) -> None:
    """Serve POST /v1/detect, GET /v1/info and GET /healthz; the key never leaves this process."""
    from openstamp.config import DetectConfig
    from openstamp.service import ServiceConfig, check_bind, load_api_keys

    setup_logging()
    check_bind(host, no_auth, public)
    check_port(host, port)
    keys = None if no_auth else load_api_keys(api_keys)
    service = ServiceConfig(
        max_texts=max_texts,
        max_chars=max_chars,
        max_request_tokens=max_request_tokens,
        max_body_bytes=int(max_body_mb * 2**20),
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        log_texts=log_texts,
        allow_token_scores=allow_token_scores,
        verify_roots=tuple(str(r) for r in verify_root or ()),
        verify_base=verify_base,
    )
    config = DetectConfig(
        alpha=fpr,
        threshold=threshold,
        calibrated=calibrated,
        min_tokens=min_tokens,
        max_tokens=max_tokens,
        batch_size=max_batch,
        n_permutations=permutations,
    )
    app = build_app(model, key, config, service, keys, dtype=dtype, device=device, cache_dir=cache_dir, base=base)
    if keys is None:
        console.print(f"[yellow]anonymous access: anyone who can reach {host}:{port} can use the detector[/]")
    else:
        console.print(f"accepting {len(keys)} API key(s)")
    run(app, host, port, max_connections)


def check_port(host: str, port: int) -> None:
    """Fail before loading anything, and before announcing the URL, when ``host:port`` cannot be bound."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise ValueError(f"--host {host}: cannot resolve it ({err})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as err:
            raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None


def build_app(model: str, key: Path | list[Path], config, service, keys, **load):
    """Load the detector (one key or several) and wrap it in the service (split out so tests can skip uvicorn)."""
    from openstamp.detect.multikey import load_detector
    from openstamp.service import create_app

    paths = [key] if isinstance(key, (str, Path)) else list(key)
    detector = load_detector(model, [str(k) for k in paths], config, **load)
    return create_app(detector, service, keys, model_name=model)


def run(app, host: str, port: int, max_connections: int) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, finish open requests (60 s at most), exit."""
    import uvicorn

    console.print(f"OpenStamp detection service on http://{host}:{port} (docs at /docs); Ctrl-C stops it")
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="info",
        limit_concurrency=max_connections,
        timeout_graceful_shutdown=60,
    )
