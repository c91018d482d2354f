"""openstamp detect: score texts for the watermark (JSON lines out, or a table on a terminal)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from openstamp.cli.common import (
    CacheOption,
    DeviceOption,
    DtypeOption,
    check_output,
    console,
    friendly_errors,
    hide_progress_bars,
    out,
    setup_logging,
)


def read_inputs(path: Path | None, texts: list[str] | None) -> tuple[list[str], list[str | None], list]:
    """Texts, prompts and ids from --text, a .txt file (one text per line), a .jsonl file, or '-' (stdin)."""
    if texts:
        return list(texts), [None] * len(texts), list(range(len(texts)))
    if path is None:
        raise ValueError("give an input file (.txt or .jsonl), '-' for stdin, or --text")
    if str(path) == "-":
        lines = sys.stdin.read().splitlines()
        return lines, [None] * len(lines), list(range(len(lines)))
    if not path.exists():
        raise FileNotFoundError(f"input file {path} does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"input {path} is a directory; give a .txt or .jsonl file")
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"input file {path} is not UTF-8 text: {err}") from err
    if path.suffix != ".jsonl":
        lines = content.splitlines()
        return lines, [None] * len(lines), list(range(len(lines)))
    out_texts, prompts, ids = [], [], []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n} is not valid JSON: {err}") from err
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{path}:{n} needs a string field 'text'")
        prompt = record.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError(f"{path}:{n} field 'prompt' must be a string")
        out_texts.append(record["text"])
        prompts.append(prompt)
        ids.append(record.get("id", n - 1))
    return out_texts, prompts, ids


def read_messages(path: Path) -> tuple[list[list[dict]], list]:
    """Conversations and ids from a .jsonl file, one {"messages": [{role, content}, ...], "id"?} per line."""
    from openstamp.detect.chat import check_messages

    if not path.is_file():
        raise FileNotFoundError(f"messages file {path} does not exist")
    conversations, ids = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n} is not valid JSON: {err}") from err
        if not isinstance(record, dict) or "messages" not in record:
            raise ValueError(f"{path}:{n} needs a field 'messages' (a list of {{role, content}})")
        try:
            check_messages(record["messages"])
        except ValueError as err:
            raise ValueError(f"{path}:{n}: {err}") from None
        conversations.append(record["messages"])
        ids.append(record.get("id", n - 1))
    return conversations, ids


@friendly_errors
def detect(
    input: Path | None = typer.Argument(
        None, help="a .txt file or - (stdin), one text per line; or .jsonl (text, optional prompt/id), one a line"
    ),
    model: str | None = typer.Option(None, "--model", "-m", help="the watermarked checkpoint (or the original model)"),
    base: str | None = typer.Option(
        None, help="the original model beside the release: its backbone reads the text (the exact p-value path)"
    ),
    key: list[Path] | None = typer.Option(
        None, "--key", "-k", help="the private key directory; repeat it to score against several keys (Holm-corrected)"
    ),
    server: str | None = typer.Option(
        None,
        help="score with a detection service (openstamp serve) at this URL instead of --model/--key "
        "(--pool: the whole set in one request)",
    ),
    token: str | None = typer.Option(
        None, envvar="OPENSTAMP_API_TOKEN", show_default=False, help="the service's API key"
    ),
    text: list[str] | None = typer.Option(None, "--text", help="a text to score (repeatable)"),
    messages: Path | None = typer.Option(
        None, help='.jsonl of conversations, {"messages": [{role, content}, ...]} a line: scores the assistant turns'
    ),
    drop_system: bool = typer.Option(False, help="--messages: leave system messages out of the context"),
    drop_reasoning: bool = typer.Option(False, help="--messages: strip <think>...</think> from assistant turns"),
    output: Path | None = typer.Option(None, "--output", "-o", help="write JSON lines here instead of stdout"),
    overwrite: bool = typer.Option(False, help="replace an existing --output or --html file"),
    fpr: float = typer.Option(0.01, help="false-positive rate of the decision"),
    threshold: float | None = typer.Option(None, help="flag when the mean LLR exceeds this instead"),
    calibrated: bool = typer.Option(False, help="flag with the key's calibrated LLR threshold for --fpr"),
    rule: str = typer.Option(
        "pvalue",
        help="pvalue: flag when p <= --fpr (permutation test, refined below its floor by the tail bound); "
        "llr: the paper's rule, mean LLR above the key's calibrated threshold for --fpr (or --threshold)",
    ),
    token_scores: bool = typer.Option(False, help="include per-token LLR scores"),
    html: Path | None = typer.Option(None, help="write per-token evidence as an HTML page"),
    min_tokens: int = typer.Option(16, help="shorter texts are reported as too short"),
    max_tokens: int = typer.Option(2048, help="longer texts are truncated to this many tokens (said on stderr)"),
    batch_size: int = typer.Option(16, help="texts per forward pass"),
    p_values: bool = typer.Option(True, help="compute permutation p-values"),
    permutations: int = typer.Option(999, help="permutations for the p-value"),
    force: bool = typer.Option(False, help="skip the check that the key belongs to this model"),
    pool: bool = typer.Option(False, help="one pooled result for the whole input: are these texts from my model?"),
    group_by: str | None = typer.Option(None, help="one pooled result per value of this .jsonl field (account, site)"),
    dedupe: bool = typer.Option(False, help="--pool/--group-by: count each repeated (context, token) pair once"),
    dtype: str = DtypeOption,
    device: str = DeviceOption,
    cache_dir: Path | None = CacheOption,
    quiet: bool = typer.Option(False, help="no progress bar"),
    engine: str = typer.Option("local", help="local (this process) or ray (Ray Data actors; needs the \\[ray] extra)"),
    workers: int = typer.Option(1, help="--engine ray: detector actors, each loading the model once"),
    out_dir: Path | None = typer.Option(
        None, "--out", help="--engine ray: folder for one scored file per input shard (existing ones are skipped)"
    ),
    out_format: str = typer.Option("jsonl", "--format", help="--engine ray: jsonl or parquet output"),
    ray_address: str | None = typer.Option(None, help="--engine ray: a running cluster (auto, ray://...)"),
    receipt: Path | None = typer.Option(None, help="write a signed receipt of the results here (needs --signing-key)"),
    signing_key: Path | None = typer.Option(None, help="the Ed25519 private key (PEM) that signs the receipt"),
) -> None:
    """Score texts for the watermark of KEY in MODEL, or with a detection service (--server)."""
    from openstamp.config import DetectConfig
    from openstamp.detect.html import render
    from openstamp.detect.multikey import load_detector
    from openstamp.storage import atomic_write_text

    setup_logging(quiet=True)
    if quiet:
        hide_progress_bars()
    check_output(output, overwrite)
    check_output(html, overwrite, "--html")
    if rule not in ("pvalue", "llr"):
        raise ValueError(f"--rule {rule!r}: choose pvalue or llr")
    if rule == "pvalue" and (threshold is not None or calibrated):
        rule = "llr"  # --threshold and --calibrated have always meant the LLR rule
    calibrated = calibrated or (rule == "llr" and threshold is None)
    if engine not in ("local", "ray"):
        raise ValueError(f"unknown engine {engine!r}; use local or ray")
    if receipt is not None or signing_key is not None:
        from openstamp.provenance.receipt import check_receipt_options

        check_receipt_options(receipt, signing_key, local=server is None and engine == "local")
    config = None  # a detection service uses its own settings
    if server is None:
        config = DetectConfig(
            alpha=fpr,
            threshold=threshold,
            calibrated=calibrated,
            min_tokens=min_tokens,
            max_tokens=max_tokens,
            batch_size=batch_size,
            p_values=p_values,
            n_permutations=permutations,
            check_key=not force,
        )
    server_decides = {  # settings of local detection; a detection service has its own (its /v1/info)
        "--model": model,
        "--key": key,
        "--fpr": fpr != 0.01,
        "--threshold": threshold,
        "--calibrated / --rule llr": calibrated,
        "--min-tokens": min_tokens != 16,
        "--max-tokens": max_tokens != 2048,
        "--no-p-values": not p_values,
        "--permutations": permutations != 999,
        "--force": force,
        "--base": base,
    }
    if dedupe and not (pool or group_by):
        raise ValueError("--dedupe applies to --pool and --group-by")
    if pool or group_by is not None:  # one result per input or per group (detect/pool.py)
        others = {"--engine ray": engine == "ray" or out_dir, "--token-scores": token_scores, "--html": html,
                  "--messages": messages}  # fmt: skip
        if given := [name for name, value in others.items() if value]:
            raise ValueError(f"{', '.join(given)}: not available with --pool/--group-by")
        if server is not None:
            check_server_options(server_decides)
        elif model is None or not key:
            raise ValueError("give --model and --key to detect a pool, or --server URL to use a detection service")
        local = {"model": model, "keys": [str(k) for k in key or []], "config": config, "dtype": dtype,
                 "device": device, "cache_dir": cache_dir, "base": base}  # fmt: skip
        detect_pools(input, text, group_by, dedupe, output, quiet, server, token, local)
        return
    if engine == "ray" or out_dir is not None:
        conflicts = {
            "--server": server,
            "--text": text,
            "--output": output,
            "--html": html,
            "--token-scores": token_scores,
            "--messages": messages,
            "several --key": key and len(key) > 1,
            "--base": base,
        }
        if given := [name for name, value in conflicts.items() if value]:
            raise ValueError(f"{', '.join(given)}: not available with --engine ray")
        if engine != "ray":
            raise ValueError("--out is for --engine ray; use --output for a single file")
        if input is None or out_dir is None or model is None or not key:
            raise ValueError("--engine ray needs an input file or folder of shards, --out, --model and --key")
        run_ray(input, out_dir, model, str(key[0]), config, workers, out_format, dtype, device, ray_address, quiet)
        return
    if server is not None:
        check_server_options(server_decides)
    elif model is None or not key:
        raise ValueError("give --model and --key to detect locally, or --server URL to use a detection service")
    if messages is not None and (input is not None or text):
        raise ValueError("give texts (a file or --text) or --messages, not both")
    if messages is None and (drop_system or drop_reasoning):
        raise ValueError("--drop-system and --drop-reasoning apply to --messages")
    if messages is not None:
        conversations, ids = read_messages(messages)
    else:
        texts, prompts, ids = read_inputs(input, text)
    if not ids:
        raise ValueError(f"no texts to score: {'stdin' if str(input) == '-' else input} is empty")
    chat = {"drop_system": drop_system, "drop_reasoning": drop_reasoning}
    want_tokens = token_scores or html is not None
    progress = not quiet and len(ids) > 8
    if server is not None:
        from openstamp.client import DetectionClient

        with DetectionClient(server, token) as client:
            if messages is not None:
                results = client.detect_messages(conversations, **chat, token_scores=want_tokens)
            else:
                results = client.detect(texts, prompts, token_scores=want_tokens)
            info = client.info()
            key_id = ", ".join(info.get("key_ids") or [info["key_id"]])
    else:
        load = {"dtype": dtype, "device": device, "cache_dir": cache_dir, "base": base}
        detector = load_detector(model, [str(k) for k in key], config, **load)
        if messages is not None:
            results = detector.detect_messages(conversations, **chat, token_scores=want_tokens, progress=progress)
        else:
            results = detector.detect(texts, prompts, token_scores=want_tokens, progress=progress)
        key_id = ", ".join(detector.key_ids)
    if truncated := sum(r.truncated for r in results):
        limit = f" to {max_tokens} tokens (--max-tokens)" if server is None else " by the server's token limit"
        console.print(f"[yellow]note:[/] {truncated} of {len(results)} texts were truncated{limit}")
    records = []
    for i, result in zip(ids, results, strict=True):
        record = {"id": i, **result.to_dict()}
        if not token_scores:
            record.pop("token_scores", None)
            record.pop("tokens", None)
        records.append(record)
    if html is not None:
        atomic_write_text(html, render(results, [f"text {i}" for i in ids], key_id))
        console.print(f"per-token evidence: {html}")
    if receipt is not None:  # signed over what was scored, before anything is printed
        from openstamp.provenance.receipt import write_detect_receipt

        write_detect_receipt(receipt, signing_key, model, key, records, conversations if messages else texts)
    write_records(records, output)


def check_server_options(server_decides: dict) -> None:
    """Refuse local detection settings beside --server: the service decides them, and silently ignoring one
    would report a decision the caller did not ask for."""
    if given := [name for name, value in server_decides.items() if value]:
        raise ValueError(f"{', '.join(given)}: the server decides these (see its /v1/info); drop them")


def detect_pools(input, text, group_by, dedupe, output, quiet, server, token, local) -> None:
    """--pool / --group-by: one pooled result (``Detector.detect_pool``) for the input, or for each group,
    scored by a detection service (``server``; one request per pool) or here (``load_detector(**local)``)."""
    texts, prompts, _ = read_inputs(input, text)
    if not texts:
        raise ValueError(f"no texts to pool: {'stdin' if str(input) == '-' else input} is empty")
    if group_by is None:
        groups = {str(input) if input is not None else "texts": list(range(len(texts)))}
    else:
        if input is None or input.suffix != ".jsonl":
            raise ValueError("--group-by needs a .jsonl input")
        groups = {}
        for i, value in enumerate(group_values(input, group_by)):
            groups.setdefault(value, []).append(i)
    sets = {name: ([texts[i] for i in rows], [prompts[i] for i in rows]) for name, rows in groups.items()}
    if server is not None:
        from openstamp.client import DetectionClient

        with DetectionClient(server, token) as client:
            results = {name: client.detect_pool(*pool, dedupe=dedupe) for name, pool in sets.items()}
    else:
        from openstamp.detect.multikey import load_detector

        detector = load_detector(**local)
        results = {
            name: detector.detect_pool(*pool, dedupe=dedupe, progress=not quiet and len(pool[0]) > 8)
            for name, pool in sets.items()
        }
    write_records([{"id": name, **result.to_dict()} for name, result in results.items()], output)


def write_records(records: list[dict], output: Path | None) -> None:
    """JSON lines into ``output`` (atomically), else a table on a terminal, else JSON lines on stdout."""
    from openstamp.storage import atomic_write_text

    lines = "".join(json.dumps(r) + "\n" for r in records)
    if output is not None:
        atomic_write_text(output, lines)
    elif sys.stdout.isatty():
        print_table(records)
    else:
        sys.stdout.write(lines)


def group_values(path: Path, field: str) -> list:
    """Each record's ``field`` of a .jsonl file, in ``read_inputs``' order (blank lines skipped)."""
    values = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            record = json.loads(line)
            if field not in record or isinstance(record[field], (dict, list)):
                raise ValueError(f"{path}:{n} needs a field {field!r} (a string or a number) for --group-by")
            values.append(record[field])
    return values


def run_ray(source, out_dir, model, key, config, workers, fmt, dtype, device, address, quiet) -> None:
    """--engine ray: score shards on Ray Data actors; say what was scored and what was skipped."""
    from openstamp.errors import require_extra

    require_extra("ray", "ray", "--engine ray")
    from openstamp.detect.ray_engine import detect_shards

    progress = None if quiet else (lambda path: console.print(f"wrote {path}"))
    summary = detect_shards(
        source,
        out_dir,
        model,
        key,
        config,
        workers=workers,
        fmt=fmt,
        dtype=dtype,
        device=device,
        address=address,
        on_shard=progress,
    )
    rate = f", {summary.tokens / summary.seconds:.0f} tokens/s" if summary.seconds else ""
    console.print(
        f"scored {len(summary.scored)} shards ({summary.rows} texts{rate}); "
        f"skipped {len(summary.skipped)} already written in {out_dir}"
    )


def print_table(records: list[dict]) -> None:
    table = Table(title="OpenStamp detection")
    extra = [c for c in ("length_band", "best_key", "n_texts") if any(c in r for r in records)]
    for column in ("id", "status", "tokens", "mean LLR", "p-value", "watermarked?", *extra):
        table.add_column(column.replace("_", " "))
    for r in records:
        score = "" if r["score"] is None else f"{r['score']:+.3f}"
        p = "" if r["p_value"] is None else f"{r['p_value']:.3g}"
        flag = {True: "[bold green]yes[/]", False: "no", None: "-"}[r["decision"]]
        table.add_row(
            str(r["id"]), r["status"], str(r["n_tokens"]), score, p, flag, *(str(r.get(c, "")) for c in extra)
        )
    out.print(table)
    if rules := list(dict.fromkeys(r["rule"] for r in records if r["status"] == "ok" and r.get("rule"))):
        out.print(f"decision rule{'s' if len(rules) > 1 else ''}: {'; '.join(rules)}")
