"""Batch detection on Ray Data (local mode) against in-process `openstamp detect`."""

import json
from pathlib import Path

import pytest
from conftest import make_corpus
from typer.testing import CliRunner

from openstamp.cli import app

ray = pytest.importorskip("ray")
pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

from openstamp.config import DetectConfig  # noqa: E402
from openstamp.detect.ray_engine import detect_shards, read_records  # noqa: E402

runner = CliRunner()
CONFIG = DetectConfig(min_tokens=4, batch_size=4)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # Ray waits a fixed 30 s for its raylet to register; on a loaded machine it may not, so try again
    for attempt in range(3):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except Exception as err:
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(err):
                raise
    yield
    ray.shutdown()


def write_shards(root, n_shards=3, per_shard=5):
    """JSONL and Parquet shards of varied lengths, some with prompts and ids, one too short."""
    root.mkdir()
    docs = make_corpus(n_shards * per_shard, words_per_doc=30, seed=7)
    for s in range(n_shards):
        rows = []
        for i in range(per_shard):
            words = docs[s * per_shard + i].split()[: 8 + 4 * i]
            row = {"text": " ".join(words)}
            if i % 2:
                row["prompt"] = "The council said"
            if s == 0:
                row["id"] = f"doc-{i}"
            rows.append(row)
        rows[-1]["text"] = "the" if s == 1 else rows[-1]["text"]
        if s == n_shards - 1:
            pq.write_table(pa.Table.from_pylist(rows), root / f"part-{s}.parquet")
        else:
            (root / f"part-{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def in_process(release, shard):
    """`openstamp detect` on the same rows, written as one JSONL file."""
    rows = read_records(shard) if shard.suffix == ".jsonl" else pq.read_table(shard).to_pylist()
    src = shard.with_name(shard.stem + ".local.jsonl")
    src.write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in rows))
    out = src.with_suffix(".scores")
    args = ["detect", "--model", str(release / "model"), "--key", str(release / "key"), "--min-tokens", "4"]
    result = runner.invoke(app, [*args, "--batch-size", "4", "--quiet", str(src), "--output", str(out)])
    assert result.exit_code == 0, result.output
    src.unlink()
    return read_records(out)


def assert_same(ours, theirs):
    assert [r["id"] for r in ours] == [r["id"] for r in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert set(a) == set(b)
        assert (a["status"], a["n_tokens"], a["decision"]) == (b["status"], b["n_tokens"], b["decision"])
        if a["status"] == "ok":
            assert a["score"] == pytest.approx(b["score"], abs=1e-5)
            assert a["p_value"] == pytest.approx(b["p_value"], abs=5e-3)
            for name, value in b["detectors"].items():
                assert a["detectors"][name] == pytest.approx(value, abs=1e-4, nan_ok=True), name


def test_ray_scores_equal_in_process_detection(release, tmp_path):
    shards = write_shards(tmp_path / "in")
    summary = detect_shards(
        shards, tmp_path / "out", str(release / "model"), str(release / "key"), CONFIG, workers=2, rows_per_batch=3
    )
    assert sorted(summary.scored) == ["part-0.jsonl", "part-1.jsonl", "part-2.parquet"] and summary.rows == 15
    statuses = []
    for shard in sorted(shards.iterdir()):
        ours = read_records(tmp_path / "out" / f"{shard.stem}.jsonl")
        assert_same(ours, in_process(release, shard))
        statuses += [r["status"] for r in ours]
    assert statuses.count("too_short") == 1 and statuses.count("ok") == 14


def engine_only(tiny_model_dir):
    """Engine logic does not depend on the head's tying: run it once, on the untied model."""
    if "untied" not in tiny_model_dir.name:
        pytest.skip("engine test: the untied model covers it")


def test_resume_after_a_killed_job_neither_loses_nor_duplicates_rows(release, tiny_model_dir, tmp_path):
    engine_only(tiny_model_dir)
    shards = write_shards(tmp_path / "in")
    out = tmp_path / "out"

    def killed_after_first_shard(path):
        raise KeyboardInterrupt(f"killed after writing {path.name}")

    with pytest.raises(KeyboardInterrupt):
        detect_shards(
            shards,
            out,
            str(release / "model"),
            str(release / "key"),
            CONFIG,
            fmt="parquet",
            on_shard=killed_after_first_shard,
        )
    written = sorted(p.name for p in out.iterdir())
    assert len(written) == 1 and len(read_records(out / written[0])) == 5  # one whole shard, nothing else
    (out / ".part-9.parquet.tmp-deadbeef").write_bytes(b"half a file")  # what a kill mid-write leaves
    summary = detect_shards(shards, out, str(release / "model"), str(release / "key"), CONFIG, fmt="parquet")
    assert [Path(s).stem for s in summary.skipped] == [Path(written[0]).stem]
    assert sorted(summary.scored + summary.skipped) == ["part-0.jsonl", "part-1.jsonl", "part-2.parquet"]
    again = detect_shards(shards, out, str(release / "model"), str(release / "key"), CONFIG, fmt="parquet")
    assert again.scored == [] and len(again.skipped) == 3
    fresh = tmp_path / "fresh"
    detect_shards(shards, fresh, str(release / "model"), str(release / "key"), CONFIG, fmt="parquet")
    for shard in sorted(shards.iterdir()):
        resumed, whole = read_records(out / f"{shard.stem}.parquet"), read_records(fresh / f"{shard.stem}.parquet")
        assert len(resumed) == 5 and [r["id"] for r in resumed] == [r["id"] for r in whole]
        assert [r["score"] for r in resumed] == pytest.approx([r["score"] for r in whole], abs=1e-5, nan_ok=True)


def test_cli_engine_ray_and_its_errors(release, tiny_model_dir, tmp_path):
    engine_only(tiny_model_dir)
    shards = write_shards(tmp_path / "in", n_shards=2, per_shard=3)
    base = ["detect", "--model", str(release / "model"), "--key", str(release / "key"), "--min-tokens", "4"]
    result = runner.invoke(app, [*base, "--engine", "ray", str(shards), "--out", str(tmp_path / "scores"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "scored 2 shards (6 texts" in result.output
    assert len(read_records(tmp_path / "scores" / "part-1.jsonl")) == 3
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.jsonl").write_text("\n")
    cases = [
        (["--engine", "spark", str(shards)], "unknown engine 'spark'"),
        (["--engine", "ray", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "does not exist"),
        (["--engine", "ray", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], "shard a.jsonl is empty"),
        (["--engine", "ray", str(shards)], "needs an input file or folder of shards, --out"),
        (["--engine", "ray", "--text", "hi", str(shards), "--out", str(tmp_path / "o")], "--text: not available"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*base, *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.jsonl").write_text('{"text": 5}\n{"text": 6}\n')
    result = runner.invoke(app, [*base, "--engine", "ray", str(tmp_path / "bad"), "--out", str(tmp_path / "o2")])
    assert result.exit_code == 2 and "needs a string 'text'" in result.output, result.output
    assert list((tmp_path / "o2").iterdir()) == []  # nothing half-written


def test_errors_raised_in_actors_are_unwrapped():
    from openstamp.detect.ray_engine import _user_error

    class Wrapper(Exception):  # how Ray wraps an actor's exception: .cause, then a chained cause
        def __init__(self, cause):
            super().__init__("UDF failed to process a data block\n<long trace>")
            self.cause = cause

    inner = ValueError("x.jsonl: every row needs a string 'text'\nFailed to apply UDF transform after 1/1 attempts")
    udf = RuntimeError("user code failed")
    udf.__cause__ = inner
    assert str(_user_error(Wrapper(udf))) == "x.jsonl: every row needs a string 'text'"
    assert _user_error(Wrapper(RuntimeError("out of memory"))) is None
