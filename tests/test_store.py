"""Evals share finished keys and generation batches through a store, by the digest of what made them."""

import os
import time

import pytest
from test_evaluation import model_dir, tiny_eval  # noqa: F401  (model_dir is a fixture)
from typer.testing import CliRunner

import openstamp.lab.evaluation.pipeline as pipeline
from openstamp.cli import app
from openstamp.lab.evaluation.store import EvalStore, open_store

METHODS = ("openstamp", "kgw")  # a trained key and a secret-only one; a weight and a decode-time watermark


def _counting(monkeypatch) -> dict:
    """Count the samplings and key builds of the evals that follow."""
    calls = {"sample": 0, "build": 0}
    sample = pipeline.sample_completions

    def sampling(*args, **kwargs):
        calls["sample"] += 1
        return sample(*args, **kwargs)

    monkeypatch.setattr(pipeline, "sample_completions", sampling)
    for name in METHODS:
        build = pipeline.REGISTRY[name].build

        def building(self, *args, _build=build, **kwargs):
            calls["build"] += 1
            return _build(self, *args, **kwargs)

        monkeypatch.setattr(pipeline.REGISTRY[name], "build", building)
    return calls


def test_a_second_eval_takes_keys_and_generations_from_the_store(model_dir, corpus_file, tmp_path, monkeypatch):  # noqa: F811
    cfg = tiny_eval(model_dir, corpus_file, METHODS, oracle="none", lengths=())
    calls = _counting(monkeypatch)
    store = EvalStore(tmp_path / "store")
    first = pipeline.run_eval(cfg, tmp_path / "a", progress=False, store=store)
    assert calls == {"sample": 6, "build": 2}  # 3 sets (unwatermarked, openstamp, kgw) x 2 batches
    assert len(list((tmp_path / "store" / "generations").glob("*.json"))) == 6
    second = pipeline.run_eval(cfg, tmp_path / "b", progress=False, store=store)
    assert calls == {"sample": 6, "build": 2} and store.hits == 2 + 6  # nothing sampled or built again
    for a, b in zip(first["runs"], second["runs"], strict=True):
        assert a["key_sha256"] == b["key_sha256"] and a["metrics"] == b["metrics"]
    # other sampling settings miss the batches but not the keys; another seed misses both
    pipeline.run_eval(tiny_eval(model_dir, corpus_file, METHODS, oracle="none", lengths=(), new_tokens=24),
                      tmp_path / "c", progress=False, store=store)  # fmt: skip
    assert calls == {"sample": 12, "build": 2}
    pipeline.run_eval(tiny_eval(model_dir, corpus_file, METHODS, oracle="none", lengths=(), seeds=(1,)),
                      tmp_path / "d", progress=False, store=store)  # fmt: skip
    assert calls == {"sample": 18, "build": 4}
    # without a store everything is made again
    pipeline.run_eval(cfg, tmp_path / "e", progress=False)
    assert calls == {"sample": 24, "build": 6}


def test_a_corrupt_batch_in_the_store_is_sampled_again(model_dir, corpus_file, tmp_path, monkeypatch):  # noqa: F811
    cfg = tiny_eval(model_dir, corpus_file, ("kgw",), oracle="none", lengths=())
    store = EvalStore(tmp_path / "store")
    first = pipeline.run_eval(cfg, tmp_path / "a", progress=False, store=store)
    kept = sorted((tmp_path / "store" / "generations").glob("*.json"))
    kept[0].write_text("{not json")
    calls = _counting(monkeypatch)
    second = pipeline.run_eval(cfg, tmp_path / "b", progress=False, store=store)
    assert calls["sample"] == 1 and first["runs"][0]["metrics"] == second["runs"][0]["metrics"]
    assert kept[0].read_text().startswith("[")  # the sampled batch replaced the corrupt entry


def test_open_store_reads_the_flag_and_the_environment(tmp_path, monkeypatch):
    assert open_store("none") is None and open_store(None) is None
    assert open_store(str(tmp_path)).root == tmp_path
    monkeypatch.setenv("OPENSTAMP_EVAL_STORE", str(tmp_path / "env"))
    assert open_store("auto").root == tmp_path / "env"
    monkeypatch.setenv("OPENSTAMP_EVAL_STORE", "none")
    assert open_store("auto") is None
    monkeypatch.delenv("OPENSTAMP_EVAL_STORE")
    monkeypatch.setenv("OPENSTAMP_CACHE", str(tmp_path / "cache"))
    assert open_store("auto").root == tmp_path / "cache" / "eval"
    (tmp_path / "file").write_text("")
    with pytest.raises(PermissionError, match="not a writable folder; pass --store none"):
        open_store(str(tmp_path / "file" / "store"))


def test_eval_command_shares_through_its_store_flag(model_dir, corpus_file, tmp_path):  # noqa: F811
    path = tmp_path / "eval.yaml"
    path.write_text(
        f"model: {model_dir}\nmethods: [openstamp]\ncorpus: {corpus_file}\n"
        f"key_corpus: {corpus_file}\nn: 3\nprompt_tokens: 8\nnew_tokens: 20\noracle: none\n"
        "batch_size: 4\nmethod_settings: {openstamp: {profile: small, n_lists: 8, shrinkage: 0.0, centre: false}}\n"
    )
    for out in ("a", "b"):
        command = ["eval", "--config", str(path), "--store", str(tmp_path / "store"), "--out", str(tmp_path / out)]
        result = CliRunner().invoke(app, [*command, "--quiet"])
        assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "store" / "generations").glob("*.json"))) == 2  # one batch per set, kept once
    assert len(list((tmp_path / "store" / "keys").iterdir())) == 1
    batches = [sorted((tmp_path / out / "generations").rglob("b*.json")) for out in ("a", "b")]
    assert len(batches[0]) == 2 and [p.read_text() for p in batches[0]] == [p.read_text() for p in batches[1]]


def _filled(root) -> EvalStore:
    """A store with two keys and two batches, the second of each last used 10 days ago."""
    kept = EvalStore(root)
    for i in range(2):
        source = root.parent / f"key{i}"
        source.mkdir()
        (source / "key.safetensors").write_bytes(b"x" * 100)
        (source / "done").write_text("")
        kept.keep_key(f"k{i}", source)
        kept.keep_batch(f"b{i}", [[1, 2, 3]])
    old = time.time() - 10 * 86400
    os.utime(root / "keys" / "k1" / "done", (old, old))
    os.utime(root / "generations" / "b1.json", (old, old))
    (root / "keys" / ".k2.tmp-half").mkdir()  # an entry being written: not listed, not removed
    return kept


def test_prune_removes_what_no_eval_used_lately_and_a_use_counts(tmp_path):
    kept = _filled(tmp_path / "store")
    assert sorted(e.path.name for e in kept.entries()) == ["b0.json", "b1.json", "k0", "k1"]
    assert {e.kind for e in kept.entries()} == {"key", "batch"} and all(e.size > 0 for e in kept.entries())
    assert kept.fetch_key("k1", tmp_path / "run" / "key") and kept.batch("b1") == [[1, 2, 3]]  # used now
    assert kept.prune(5) == []
    os.utime(tmp_path / "store" / "keys" / "k1" / "done", (0, 0))
    assert [e.path.name for e in kept.prune(5)] == ["k1"]
    assert not (tmp_path / "store" / "keys" / "k1").exists() and (tmp_path / "run" / "key" / "done").exists()
    assert len(kept.prune()) == 3 and kept.entries() == []
    assert (tmp_path / "store" / "keys" / ".k2.tmp-half").exists()


def test_store_command_shows_and_prunes(tmp_path):
    root = tmp_path / "store"
    _filled(root)
    runner = CliRunner()
    shown = runner.invoke(app, ["store", "--store", str(root)])
    assert shown.exit_code == 0, shown.output
    assert "keys" in shown.output and "generation batches" in shown.output
    pruned = runner.invoke(app, ["store", "--store", str(root), "--prune-days", "5"])
    assert pruned.exit_code == 0 and "removed 2 entries" in pruned.output
    assert sorted(e.path.name for e in EvalStore(root).entries()) == ["b0.json", "k0"]
    both = runner.invoke(app, ["store", "--store", str(root), "--prune-days", "5", "--clear"])
    assert both.exit_code != 0 and "not both" in both.output
    none = runner.invoke(app, ["store", "--store", "none"])
    assert none.exit_code != 0 and "names no store" in none.output
    cleared = runner.invoke(app, ["store", "--store", str(root), "--clear"])
    assert cleared.exit_code == 0 and EvalStore(root).entries() == []
