"""A tiny random Llama with the packaged model's tokenizer and chat template, for ``--smoke`` runs.

Smoke runs check a benchmark's plumbing in seconds on a CPU; their numbers mean nothing.
"""

from __future__ import annotations

from pathlib import Path

# embedding settings that suit the tiny model: no projection (no sentence embedder), few states
SMOKE_OVERRIDES = {
    "states.n_states": 256,
    "states.window_tokens": 96,
    "states.positions_per_window": 32,
    "states.context_tokens": 16,
    "projection.enabled": False,
    "selector.n_lists": 6,
    "selector.min_cluster_size": 5,
}


def tiny_model(out: Path, source: str = "smollm2-135m") -> Path:
    """Save (once) a 2-layer, 32-wide untied Llama with ``source``'s tokenizer under ``out``; its path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from openstamp.model.load import load_tokenizer

    if (out / "config.json").exists():
        return out
    tokenizer = load_tokenizer(source)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
