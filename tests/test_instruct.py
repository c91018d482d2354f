"""Instruction tuning: data formats, response-only labels, a falling loss, and the attack end to end."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_model
from test_attacks import CHAT_TEMPLATE
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.errors import CorpusError
from openstamp.lab.attacks.common import open_eval
from openstamp.lab.attacks.instruct import (
    InstructConfig,
    build_offline_set,
    encode_example,
    instruction_batches,
    read_examples,
    run_instruct,
)
from openstamp.lab.training import prepare, train

runner = CliRunner()
ROWS = [
    {"instruction": "Name the river.", "input": "the river city council", "output": "the river"},
    {"messages": [{"role": "user", "content": "Say rain."}, {"role": "assistant", "content": "rain"}]},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("template", [None, CHAT_TEMPLATE])
def test_labels_cover_the_response_only(tokenizer, template):
    tokenizer.chat_template = template
    try:
        prompt, response = encode_example(tokenizer, [{"role": "user", "content": "Say rain."}, ROWS[1]["messages"][1]])
        ids, labels = instruction_batches(tokenizer, ROWS, 64)
    finally:
        tokenizer.chat_template = None
    text = tokenizer.decode(prompt)
    assert ("Answer: " in text) == (template is not None) and ("### Response:" in text) == (template is None)
    assert response[-1] == tokenizer.eos_token_id and tokenizer.decode(response[:-1]) == "rain"
    assert ids.shape == labels.shape == (2, 64)
    second = labels[1][labels[1] != -100].tolist()
    assert second == response  # the padding and the prompt carry no loss
    assert torch.equal(ids[1, len(prompt) : len(prompt) + len(response)], torch.tensor(response))


def test_bad_data_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_examples(str(tmp_path / "missing.jsonl"), 10)
    with pytest.raises(CorpusError, match="no rows"):
        read_examples(str(_write(tmp_path / "empty.jsonl", [])), 10)
    with pytest.raises(CorpusError, match="neither"):
        read_examples(str(_write(tmp_path / "bad.jsonl", [{"text": "x"}])), 10)
    assert read_examples(str(_write(tmp_path / "ok.jsonl", ROWS)), 1) == ROWS[:1]


def test_a_local_dataset_folder_is_read_through_hf(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([ROWS[0]] * 3).save_to_disk(tmp_path / "alpaca")
    assert read_examples(f"hf:{tmp_path / 'alpaca'}", 10) == [ROWS[0]] * 3


def test_offline_set_has_the_three_tasks(corpus_file):
    rows = build_offline_set(str(corpus_file), 6)
    assert len(rows) == 6 and len({r["instruction"] for r in rows}) == 3
    assert all(r["output"] and r["input"] for r in rows)


def test_offline_set_reads_corpus_specs_with_spaces(corpus_file):
    assert build_offline_set(f"{corpus_file}, {corpus_file}", 6) == build_offline_set(f"{corpus_file},{corpus_file}", 6)


def test_instruction_loss_falls(tokenizer, corpus_file):
    model = make_model(False, len(tokenizer))
    ids, labels = instruction_batches(tokenizer, build_offline_set(str(corpus_file), 8), 96)
    cfg = InstructConfig(mode="full", steps=12, every=6, batch_size=4, seq_len=96, lr=3e-3, optimizer="adamw")
    losses = train(prepare(model, cfg), ids, cfg, labels=labels)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3


def test_instruct_attack_end_to_end_and_cli(eval_dir, corpus_file, tmp_path):
    out = tmp_path / "instruct"
    cfg = InstructConfig(corpora=str(corpus_file), examples=8, steps=2, every=2, batch_size=2, seq_len=64, n=2)
    results = run_instruct(eval_dir, out, cfg, progress=False)
    assert results["skipped"] == ["kgw"] and results["examples"] == 8
    assert {(r["method"], r["step"]) for r in results["runs"]} == {
        (m, s) for m in ("openstamp", "unremovable") for s in (0, 2)
    }
    assert "Training loss" in (eval_dir / "attacks" / "instruct.md").read_text()
    data = _write(tmp_path / "local.jsonl", ROWS * 2)
    args = ["attack", "instruct", "--eval", str(eval_dir), "--out", str(tmp_path / "i"), "--steps", "1"]
    small = ["--every", "1", "--n", "2", "--seq-len", "48", "--batch-size", "2", "--methods", "unremovable"]
    result = runner.invoke(app, [*args, *small, "--data", str(data), "--at-cost", "0.3"])
    assert result.exit_code == 0, result.output
    # at equal cost: the eval's run of unremovable whose own perplexity change is nearest +30%, named with its cost
    chosen = json.loads((tmp_path / "i" / "results.json").read_text())
    cost = {r["run"]: r["metrics"]["own_ppl_change"] for r in open_eval(eval_dir).runs}
    runs = sorted({r["run"] for r in chosen["runs"]})
    assert chosen["settings"]["at_cost"] == 0.3 and len(runs) == 1
    assert f"nearest +30% ({runs[0]} {cost[runs[0]]:+.1%})." in (eval_dir / "attacks" / "i.md").read_text()
    missing = runner.invoke(app, [*args, *small, "--data", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
