"""Which engine samples completions: transformers (everywhere) or vLLM (a GPU with vLLM installed).

The watermark lives in the checkpoint's weights, so vLLM needs no logits processor: a saved
watermarked model is served by ``vllm.LLM(model=dir)`` as it is. Decode-time baselines (KGW)
need a logits processor and always use transformers.

The vLLM path runs only on a machine with a CUDA GPU; the unit tests exercise the selection
and the glue code with a stand-in ``vllm`` module, not vLLM itself.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

from openstamp.storage import atomic_directory

log = logging.getLogger(__name__)
GENERATORS = ("transformers", "vllm", "auto")


@dataclass(frozen=True)
class GeneratorChoice:
    name: str  # the engine that will run: transformers or vllm
    reason: str  # one line a user can act on

    @property
    def is_vllm(self) -> bool:
        return self.name == "vllm"


def vllm_available() -> tuple[bool, str]:
    """Whether vLLM can run here, and if not, why (one line)."""
    if importlib.util.find_spec("vllm") is None:
        return False, "vLLM is not installed (pip install 'openstamp[vllm]' on a CUDA machine)"
    import torch

    if not torch.cuda.is_available():
        return False, "vLLM needs a CUDA GPU and none is visible"
    return True, "vLLM and a CUDA GPU are present"


def select_generator(requested: str) -> GeneratorChoice:
    """``transformers``, ``vllm`` (falls back to transformers with a message) or ``auto``."""
    if requested not in GENERATORS:
        raise ValueError(f"unknown generator {requested!r}; use one of {', '.join(GENERATORS)}")
    if requested == "transformers":
        return GeneratorChoice("transformers", "transformers was asked for")
    ok, why = vllm_available()
    if ok:
        return GeneratorChoice("vllm", why)
    if requested == "vllm":
        log.warning("%s; generating with transformers instead", why)
    return GeneratorChoice("transformers", f"{why}; using transformers")


def vllm_completions(
    model_dir: str | Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    dtype: str = "auto",
    gpu_memory_utilization: float = 0.5,
) -> list[list[int]]:
    """Sample exactly ``max_new_tokens`` tokens after each prompt (token ids, BOS included) with vLLM.

    EOS is ignored, as in :func:`openstamp.model.generate.sample_completions`; ``temperature=0`` is greedy.
    The engine is released afterwards, so a caller may build the next one.
    """
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model_dir),
        dtype=dtype,
        seed=seed,
        gpu_memory_utilization=gpu_memory_utilization,
        skip_tokenizer_init=True,
    )
    params = SamplingParams(
        n=1,
        temperature=temperature,
        top_p=top_p if temperature > 0 else 1.0,
        top_k=-1 if temperature > 0 else 1,
        max_tokens=max_new_tokens,
        min_tokens=max_new_tokens,
        ignore_eos=True,
        seed=seed,
        detokenize=False,
    )
    outputs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    ids = [list(o.outputs[0].token_ids) for o in outputs]
    del llm
    gc.collect()
    _free_cuda()
    return ids


def _free_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def export_for_vllm(model, tokenizer, directory: Path) -> Path:
    """Save the model as it is now (watermarked or not) where vLLM can load it; reused if present."""
    if (directory / "config.json").exists():
        return directory

    with atomic_directory(directory) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return directory
