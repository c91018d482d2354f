"""Generator selection: vLLM only with vLLM and a GPU; otherwise a clear message and transformers.

vLLM itself never runs here (no GPU): the vLLM glue is checked against a stand-in module.
"""

import logging
import sys
import types

import pytest
import torch

from openstamp.lab import generators
from openstamp.lab.generators import select_generator, vllm_completions


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` that records how it was called and returns fixed tokens."""
    calls = {}

    class LLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs

        def generate(self, prompts, params, use_tqdm=True):
            calls["prompts"], calls["params"] = prompts, params
            n = params.kwargs["max_tokens"]
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[7] * n)]) for _ in prompts]

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = LLM, SamplingParams
    module.__spec__ = types.SimpleNamespace(name="vllm")
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(generators.importlib.util, "find_spec", lambda name: object() if name == "vllm" else None)
    return calls


def test_without_vllm_or_gpu_falls_back_to_transformers_with_a_message(monkeypatch, caplog):
    monkeypatch.setattr(generators.importlib.util, "find_spec", lambda name: None)
    with caplog.at_level(logging.WARNING):
        choice = select_generator("vllm")
    assert choice.name == "transformers" and "not installed" in choice.reason
    assert "pip install 'openstamp[vllm]'" in caplog.text and "transformers instead" in caplog.text
    assert select_generator("auto").name == "transformers"
    assert select_generator("transformers").reason == "transformers was asked for"


def test_vllm_without_a_gpu_falls_back(fake_vllm, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    choice = select_generator("vllm")
    assert choice.name == "transformers" and "CUDA GPU" in choice.reason


def test_vllm_and_a_gpu_select_vllm(fake_vllm, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert select_generator("vllm").is_vllm and select_generator("auto").is_vllm
    assert select_generator("transformers").name == "transformers"  # an explicit choice is kept


def test_unknown_generator_is_refused():
    with pytest.raises(ValueError, match="unknown generator 'tgi'"):
        select_generator("tgi")


def test_vllm_glue_loads_the_checkpoint_as_is_and_samples_fixed_lengths(fake_vllm, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ids = vllm_completions(tmp_path, [[1, 5, 6], [1, 9]], 4, temperature=0.7, top_p=0.9, seed=3)
    assert ids == [[7] * 4, [7] * 4]
    assert fake_vllm["llm"]["model"] == str(tmp_path)  # no processor, no hooks: the saved model is all it takes
    assert fake_vllm["prompts"] == [{"prompt_token_ids": [1, 5, 6]}, {"prompt_token_ids": [1, 9]}]
    params = fake_vllm["params"].kwargs
    assert params["min_tokens"] == params["max_tokens"] == 4 and params["ignore_eos"]
    assert (params["temperature"], params["top_p"], params["seed"]) == (0.7, 0.9, 3)


def test_eval_generation_set_uses_vllm_for_weight_level_sets_only(fake_vllm, monkeypatch, tmp_path, tokenizer):
    from conftest import make_model

    from openstamp.lab.evaluation.pipeline import generate_set
    from openstamp.lab.generators import GeneratorChoice

    cfg = types.SimpleNamespace(batch_size=2, new_tokens=5, temperature=1.0, top_p=1.0, sample_dtype="float32")
    model, prompts = make_model(False, len(tokenizer)), [[5, 6], [7], [8, 9, 10]]
    vllm = GeneratorChoice("vllm", "test")
    ids = generate_set(tmp_path, "openstamp@1/s0", model, tokenizer, prompts, cfg, 0, None, False, vllm)
    assert ids == [[7] * 5] * 3 and len(fake_vllm["prompts"]) == 3
    assert sorted(p.name for p in (tmp_path / "generations" / "openstamp@1" / "s0").iterdir()) == [
        "b0000.json",
        "b0001.json",
    ]
    assert not (tmp_path / "vllm-model").exists()  # the exported weights are removed after sampling
    fake_vllm.clear()
    processor = object()  # a decode-time method (KGW) needs transformers' logits processors
    monkeypatch.setattr("openstamp.lab.evaluation.pipeline.sample_completions", lambda *a, **k: [[3] * 5] * len(a[2]))
    ids = generate_set(tmp_path, "kgw@1/s0", model, tokenizer, prompts, cfg, 0, processor, False, vllm)
    assert ids == [[3] * 5] * 3 and fake_vllm == {}
