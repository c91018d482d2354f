"""Sentence embeddings (the projection's targets; paraphrase similarity)."""

from __future__ import annotations

from functools import lru_cache

import torch

from openstamp.assets import embedder_path


@lru_cache(maxsize=2)
def load_embedder(name: str = "minilm", device: str = "cpu"):
    """Load a sentence-transformers model: ``minilm`` (packaged), a hub name or a local path."""
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(embedder_path(name), device=device)
    except OSError as err:
        raise ValueError(f"could not load sentence embedder {name!r}: {err}") from err


def encode_texts(
    texts: list[str], name: str = "minilm", batch_size: int = 64, progress: bool = True, device: str = "cpu"
) -> torch.Tensor:
    """L2-normalised embeddings, fp32 (N, k)."""
    model = load_embedder(name, device)
    vectors = model.encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_tensor=True,
        show_progress_bar=progress,
    )
    return vectors.float().cpu()
