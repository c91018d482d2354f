"""benchmarks/frontier/protocol.py: document splits that never overlap, the config's rules, grid bracketing."""

import dataclasses
import json

import numpy as np
import pytest
from conftest import make_corpus

from openstamp.corpus import Document, load_documents


@pytest.fixture
def protocol(benchmark):
    return benchmark("frontier/protocol")


def documents(n=400):
    return [Document(f"doc:{i}", t) for i, t in enumerate(make_corpus(n, 60, seed=3))]


def test_split_gives_four_disjoint_parts_of_every_document(protocol):
    docs, cfg = documents(), protocol.ProtocolConfig()
    parts = protocol.split_protocol(docs, cfg)
    assert list(parts) == list(protocol.PARTS) and all(parts.values())
    assert sorted(d.id for p in parts.values() for d in p) == sorted(d.id for d in docs)
    protocol.check_disjoint(parts)  # passes on the real split
    held = len(docs) - len(parts["key"])
    assert abs(len(parts["tune"]) / held - cfg.tune_fraction) < 0.08
    assert abs(len(parts["test"]) / held - cfg.test_fraction) < 0.08
    assert protocol.split_protocol(list(reversed(docs)), cfg)["test"] == list(reversed(parts["test"]))


def test_disjointness_check_fails_on_an_overlapping_split(protocol):
    parts = protocol.split_protocol(documents(), protocol.ProtocolConfig())
    leaked = Document("renamed", parts["tune"][0].text)  # another id, the same text
    with pytest.raises(ValueError, match="tune and test share 1"):
        protocol.check_disjoint({**parts, "test": parts["test"] + [leaked]})


def test_the_packaged_corpus_splits_disjoint(protocol):
    docs = load_documents("news")
    protocol.check_disjoint(protocol.split_protocol(docs, protocol.ProtocolConfig()))


@pytest.mark.parametrize(
    "bad",
    [
        {"test_seeds": (1, 2, 3, 4)},  # fewer than 5 fresh keys
        {"test_seeds": (0, 10, 11, 12, 13)},  # a tuned seed
        {"n_test_prompts": 399},
        {"min_threshold_texts": 999},
        {"min_grid_points": 5},
        {"targets": (0.05, 0.3)},  # outside the cost range
        {"tune_fraction": 0.5, "test_fraction": 0.5},
    ],
)
def test_config_rejects_a_protocol_that_does_not_hold(protocol, bad):
    with pytest.raises(ValueError):
        protocol.ProtocolConfig(**bad)
    fields = dataclasses.fields(protocol.ProtocolConfig)
    assert all(f.metadata.get("help") for f in fields)


def test_grid_gaps_names_the_targets_without_bracketing_points(protocol):
    cfg = protocol.ProtocolConfig()
    dense = [0.02, 0.04, 0.07, 0.09, 0.13, 0.18, 0.23]
    assert protocol.grid_gaps(dense, cfg) == {"points_in_range": 7, "enough": True, "targets": {}}
    sparse = [0.01, 0.03, 0.12, 0.15, 0.3]
    gaps = protocol.grid_gaps(sparse, cfg)
    assert not gaps["enough"] and gaps["points_in_range"] == 3
    assert gaps["targets"] == {0.05: ["above"], 0.1: ["below"], 0.2: ["below", "above"]}


def test_supply_counts_prompts_and_threshold_texts(protocol):
    cfg = protocol.ProtocolConfig()
    supply = protocol.supply({"test": [1000] * 300, "thresholds": [450] * 1000}, cfg)
    assert supply["test_prompts"] == 600 and supply["test_prompts_enough"]  # 4 windows each, 2 kept
    assert supply["threshold_texts"] == {16: 2000, 32: 2000, 64: 2000, 200: 2000}
    assert supply["threshold_texts_enough"]
    assert not protocol.supply({"test": [300] * 300, "thresholds": [199] * 9000}, cfg)["threshold_texts_enough"]


def test_paired_rows_cover_every_length_target_and_interpolation(protocol):
    cfg = dataclasses.replace(protocol.ProtocolConfig(), lengths=(16, 64), n_boot=100)
    rng, costs = np.random.default_rng(0), [0.02, 0.04, 0.07, 0.09, 0.13, 0.18, 0.23]
    grids = {
        name: {"costs": costs, "hits": {n: rng.random((5, 400, 7)) < np.linspace(0.1, p, 7) for n in (16, 64)}}
        for name, p in (("openstamp", 0.9), ("kgw-llr", 0.8))
    }
    rows = protocol.paired_rows(grids, cfg)
    assert len(rows) == 2 * 3 * 2
    assert {(r["length"], r["target"], r["how"]) for r in rows} == {
        (n, t, h) for n in (16, 64) for t in cfg.targets for h in ("linear", "budget")
    }
    assert all(r["low"] <= r["difference"] <= r["high"] for r in rows)


def test_plan_writes_json_with_parts_and_supply(protocol, tmp_path, corpus_file, tiny_model_dir, monkeypatch):
    out = tmp_path / "plan.json"
    code = protocol.main(["--corpus", str(corpus_file), "--model", str(tiny_model_dir), "--out", str(out)])
    plan = json.loads(out.read_text())
    assert code == 1 and not plan["supply"]["test_prompts_enough"]  # 40 short documents cannot hold the protocol
    assert set(plan["parts"]) == set(plan["documents"]) == {"key", "tune", "test", "thresholds"}
    assert sum(p["documents"] for p in plan["parts"].values()) == 40
