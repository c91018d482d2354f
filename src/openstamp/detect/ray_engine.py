"""Batch detection on Ray Data: sharded JSONL/Parquet in, one scored file per shard out.

The flow reads top to bottom in :func:`detect_shards`:

1. list the input shards and count their rows (cheap: lines, or Parquet metadata);
2. drop the shards whose output already exists, so a restarted job resumes;
3. read the rest with ``ray.data.read_json`` / ``read_parquet`` (keeping each row's path);
4. ``map_batches`` over an actor pool: each actor loads the :class:`Detector` once, from the
   model and key paths, and scores batches with it;
5. the driver receives the scored rows in order and writes each shard's output atomically
   (temporary file, then rename) as soon as all of its rows are in.

A shard's output appears whole or not at all, so a killed job neither loses nor duplicates
rows: rerunning it scores exactly the shards that are missing. Each output row holds the same
fields as ``openstamp detect``. Ray is imported here only; the core package never needs it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openstamp.config import DetectConfig
from openstamp.detect.detector import Detector
from openstamp.storage import atomic_write_bytes, atomic_write_text

log = logging.getLogger(__name__)
INPUT_SUFFIXES = (".jsonl", ".parquet")
OUTPUT_FORMATS = ("jsonl", "parquet")


@dataclass(frozen=True)
class Shard:
    path: Path
    rows: int

    def output(self, out_dir: Path, fmt: str) -> Path:
        return out_dir / f"{self.path.stem}.{fmt}"


@dataclass
class RayRunSummary:
    """What one run did: shards scored now, shards skipped because their output existed."""

    scored: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    rows: int = 0
    tokens: int = 0
    seconds: float = 0.0


def list_shards(source: Path) -> list[Shard]:
    """The input shards (a file, or the .jsonl/.parquet files of a folder) with their row counts."""
    if not source.exists():
        raise FileNotFoundError(f"input {source} does not exist")
    paths = [source] if source.is_file() else sorted(p for p in source.iterdir() if p.suffix in INPUT_SUFFIXES)
    if not paths:
        raise ValueError(f"input folder {source} holds no .jsonl or .parquet shards")
    if bad := [p.name for p in paths if p.suffix not in INPUT_SUFFIXES]:
        raise ValueError(f"{bad[0]}: --engine ray reads .jsonl or .parquet shards")
    stems = [p.stem for p in paths]
    if dupes := sorted({s for s in stems if stems.count(s) > 1}):
        raise ValueError(f"two shards share the name {dupes[0]!r}; their outputs would collide")
    shards = [Shard(p.resolve(), _count_rows(p)) for p in paths]
    if empty := [s.path.name for s in shards if s.rows == 0]:
        raise ValueError(f"shard {empty[0]} is empty")
    return shards


def _count_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


class DetectActor:
    """One Ray actor: loads the Detector once, then scores batches of rows.

    A batch is a pyarrow table with ``text``, ``path`` and optional ``prompt``/``id``; the
    answer has ``path``, ``id`` (null when the input has none) and ``record`` (the JSON of the
    detection result, as ``openstamp detect`` writes it).
    """

    def __init__(self, model: str, key: str, config: DetectConfig, dtype: str, device: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.detector = Detector.from_pretrained(model, key, config, dtype=dtype, device=device)

    def __call__(self, batch):
        import pyarrow as pa

        columns = set(batch.column_names)
        paths = batch.column("path").to_pylist()
        if "text" not in columns:
            raise ValueError(f"{paths[0]} needs a string field 'text'")
        texts = batch.column("text").to_pylist()
        prompts = batch.column("prompt").to_pylist() if "prompt" in columns else [None] * len(texts)
        ids = batch.column("id").to_pylist() if "id" in columns else [None] * len(texts)
        for text, prompt, path in zip(texts, prompts, paths, strict=True):
            if not isinstance(text, str) or not (prompt is None or isinstance(prompt, str)):
                raise ValueError(f"{path}: every row needs a string 'text' (and a string 'prompt' if any)")
        results = self.detector.detect(texts, prompts)
        records = [json.dumps(r.to_dict()) for r in results]
        return pa.table({"path": paths, "id": pa.array([_json_id(i) for i in ids], pa.string()), "record": records})


def _json_id(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def detect_shards(
    source: Path,
    out_dir: Path,
    model: str,
    key: str,
    config: DetectConfig,
    *,
    workers: int = 1,
    fmt: str = "jsonl",
    dtype: str = "float32",
    device: str = "cpu",
    rows_per_batch: int | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    on_shard: Callable[[Path], None] | None = None,
) -> RayRunSummary:
    """Score every shard of ``source`` whose output is not yet in ``out_dir``.

    Args:
        source: a .jsonl/.parquet file, or a folder of them (one output file per shard).
        out_dir: where ``<shard>.<fmt>`` files are written, each atomically.
        workers: detector actors (each loads the model once).
        rows_per_batch: rows handed to an actor per call (default: the detector's batch size x 4).
        address: a running Ray cluster (``auto`` or ``ray://...``); default: a local Ray.
        num_cpus: CPUs of the local Ray (default: all).
        on_shard: called with each output path once it is written (progress, tests).
    """
    if fmt not in OUTPUT_FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    if workers < 1:
        raise ValueError("--workers must be >= 1")
    shards = list_shards(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = RayRunSummary()
    todo = []
    for shard in shards:
        (summary.skipped if shard.output(out_dir, fmt).exists() else todo).append(shard)
    summary.skipped = [s.path.name for s in summary.skipped]
    if not todo:
        return summary
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        dataset = _dataset(todo, model, key, config, workers, dtype, device, rows_per_batch)
        try:
            _collect(dataset, todo, out_dir, fmt, summary, on_shard)
        except ray.exceptions.RayError as err:  # a bad row or a bad key inside an actor: say it in one line
            raise _user_error(err) or err from None
        summary.seconds = time.perf_counter() - t0
    finally:
        if started:
            ray.shutdown()
    return summary


def _dataset(shards, model, key, config, workers, dtype, device, rows_per_batch):
    import ray.data

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # rows come back shard by shard, in order
    context.enable_progress_bars = False
    context.raise_original_map_exception = True  # an actor's ValueError reaches the driver as one
    parts = []
    for suffix, reader in ((".jsonl", ray.data.read_json), (".parquet", ray.data.read_parquet)):
        paths = [str(s.path) for s in shards if s.path.suffix == suffix]
        if paths:
            parts.append(reader(paths, include_paths=True))
    dataset = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    cpus = ray.cluster_resources().get("CPU", 1)
    threads = max(1, int(cpus // workers)) if device == "cpu" else 1
    # actors leave one CPU free for the read tasks; asking for all of them deadlocks the pipeline
    request = min(threads, max(0.1, (cpus - 1) / workers)) if device == "cpu" else 1
    return dataset.map_batches(
        DetectActor,
        fn_constructor_kwargs=dict(model=model, key=key, config=config, dtype=dtype, device=device, threads=threads),
        compute=ray.data.ActorPoolStrategy(size=workers),
        batch_size=rows_per_batch or config.batch_size * 4,
        batch_format="pyarrow",
        num_cpus=request if device == "cpu" else 0,
        num_gpus=1 if device.startswith("cuda") else 0,
    )


def _user_error(err: BaseException) -> Exception | None:
    """The ValueError (bad input, wrong key) that a Ray task or actor raised, without Ray's wrapping."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, ValueError) and not hasattr(err, "cause"):  # Ray's wrappers carry .cause
            return ValueError(str(err).splitlines()[0] if str(err) else "")  # Ray appends its retry advice
        err = getattr(err, "cause", None) or err.__cause__ or err.__context__
    return None


def _collect(dataset, todo, out_dir, fmt, summary, on_shard) -> None:
    """Group the ordered stream by shard; write each shard once all its rows are in."""
    expected = {str(s.path): s for s in todo}
    pending: dict[str, list[dict]] = {}
    for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
        for path, row_id, record in zip(*(batch.column(c).to_pylist() for c in ("path", "id", "record")), strict=True):
            path = str(Path(path).resolve())
            if path not in expected:
                raise RuntimeError(f"Ray returned a row from an unknown shard {path}")
            rows = pending.setdefault(path, [])
            result = json.loads(record)
            rows.append({"id": json.loads(row_id) if row_id is not None else len(rows), **result})
            shard = expected[path]
            if len(rows) == shard.rows:
                target = shard.output(out_dir, fmt)
                write_records(target, pending.pop(path), fmt)
                summary.scored.append(shard.path.name)
                summary.rows += shard.rows
                summary.tokens += sum(r["n_tokens"] for r in rows)
                if on_shard is not None:
                    on_shard(target)
    if pending:
        name = Path(next(iter(pending))).name
        raise RuntimeError(f"shard {name}: Ray returned fewer rows than the shard holds; nothing was written for it")


def write_records(path: Path, records: list[dict], fmt: str) -> Path:
    """Write one shard's records atomically, as JSON lines or Parquet."""

    if fmt == "jsonl":
        return atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), buffer)
    return atomic_write_bytes(path, buffer.getvalue())


def read_records(path: Path) -> list[dict]:
    """Read back a shard output (JSON lines or Parquet) as a list of records."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
