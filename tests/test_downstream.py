import json
import random

import pytest
import torch

from openstamp.lab.evaluation.downstream import LOCAL_TASKS, build_local_tasks, change, processed_logits, task_names

WORDS = "river market energy glacier museum village harbour station garden bridge mountain island".split()


@pytest.fixture(scope="module")
def sentence_corpus(tmp_path_factory):
    """Documents of many capitalised sentences (the local tasks need sentences and words of 4+ letters)."""
    rng = random.Random(0)
    docs = []
    for _ in range(60):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))).capitalize() + "." for _ in range(14)
        ]
        docs.append({"text": " ".join(sentences)})
    path = tmp_path_factory.mktemp("sentences") / "docs.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    return path


def test_local_tasks_are_four_way_items_with_the_answer_at_the_label(sentence_corpus, tmp_path):
    build_local_tasks(tmp_path, str(sentence_corpus), 20)
    for task in LOCAL_TASKS:
        items = [json.loads(line) for line in (tmp_path / f"{task}.jsonl").read_text().splitlines()]
        assert 10 <= len(items) <= 20, task
        labels = {item["label"] for item in items}
        assert len(labels) > 1 and labels <= {0, 1, 2, 3}  # the answer is not always in one place
        for item in items:
            assert len(item["choices"]) == 4 and item["context"]
        assert f"task: {task}" in (tmp_path / f"{task}.yaml").read_text()
    assert task_names(("local", "arc_challenge")) == (*LOCAL_TASKS, "arc_challenge")


def test_local_tasks_read_corpus_specs_with_spaces(sentence_corpus, tmp_path):
    spaced, plain = tmp_path / "spaced", tmp_path / "plain"
    spaced.mkdir(), plain.mkdir()
    build_local_tasks(spaced, f"{sentence_corpus}, {sentence_corpus}", 20)
    build_local_tasks(plain, f"{sentence_corpus},{sentence_corpus}", 20)
    for task in LOCAL_TASKS:
        assert (spaced / f"{task}.jsonl").read_text() == (plain / f"{task}.jsonl").read_text()


def test_paired_change_and_its_interval():
    d = change([1, 1, 0, 1], [1, 0, 0, 0])
    assert d["acc"] == 0.75 and d["change"] == pytest.approx(0.5) and d["ci"][0] < 0.5 < d["ci"][1]


def test_a_processor_reaches_every_position_of_the_forward_pass(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor([[1, 5, 6, 7, 8]])

    def processor(prefix, logits):
        assert prefix.shape[1] >= 1
        logits = logits.clone()
        logits[:, 3] += 1e4
        return logits

    with torch.no_grad(), processed_logits(model, processor):
        assert (model(input_ids=ids).logits.argmax(-1) == 3).all()
    with torch.no_grad():  # the hook is gone afterwards
        assert not (model(input_ids=ids).logits.argmax(-1) == 3).all()


def test_eval_reports_downstream_accuracy_against_the_original(model_dir, sentence_corpus, tmp_path):
    pytest.importorskip("lm_eval")
    import numpy as np

    from openstamp.lab.evaluation.config import EvalConfig
    from openstamp.lab.evaluation.pipeline import run_eval

    cfg = EvalConfig.from_dict(
        {
            "model": str(model_dir),
            "methods": ["unremovable", "kgw"],  # one weight-level, one decode-time method
            "corpus": str(sentence_corpus),
            "key_corpus": str(sentence_corpus),
            "n": 4,
            "prompt_tokens": 8,
            "new_tokens": 32,
            "batch_size": 4,
            "score_batch_size": 4,
            "oracle": "none",
            "lengths": [],
            "downstream": ["local"],
            "downstream_limit": 8,
            "strengths": {"unremovable": 2.0, "kgw": 3.0},
        }
    )
    results = run_eval(cfg, tmp_path, progress=False)
    original = json.loads((tmp_path / "downstream" / "original.json").read_text())
    assert set(original) == set(LOCAL_TASKS) and all(len(v) == 8 for v in original.values())
    assert results["downstream_original"] == {t: float(np.mean(v)) for t, v in original.items()}
    for run in results["runs"]:
        m = run["metrics"]
        own = json.loads((tmp_path / "downstream" / f"{run['generations'].replace('/', '_')}.json").read_text())
        for task in LOCAL_TASKS:
            assert m["downstream"][task]["change"] == pytest.approx(np.mean(own[task]) - np.mean(original[task]))
        assert m["downstream_acc"] == pytest.approx(np.mean([np.mean(own[t]) for t in LOCAL_TASKS]))
    assert "## Downstream accuracy (lm-eval)" in (tmp_path / "report.md").read_text()
