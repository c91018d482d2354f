"""POST /v1/verify-model: the weights test (``openstamp.provenance.verify_model``) on a checkpoint the server
may read, against the served key; behind the same API keys as /v1/detect.

The request names a path, never a URL or hub id: an absolute path, or one relative to the first verify root.
It must resolve (symlinks followed) inside one of ``ServiceConfig.verify_roots``; with no roots, or no
``verify_base``, the route answers 403. Missing paths give 404, a file that is not a model or a model of
another shape 400. The base's matrices are read once, on the first request.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from fastapi import FastAPI, HTTPException, Security
from pydantic import BaseModel, Field

from openstamp.service.config import ServiceConfig


class VerifyRequest(BaseModel):
    path: str = Field(description="a model directory, .gguf or .safetensors file under one of the verify roots")
    key_id: str | None = Field(None, description="which served key (needed when the server has several)")
    permutations: int = Field(999, ge=1, le=99_999, description="permutations for the p-value (floor 1/(K+1))")


def allowed_path(path: str, roots: tuple[str, ...]) -> Path:
    """``path`` resolved inside one of ``roots``; HTTPException 403 outside them, 404 when it does not exist."""
    resolved_roots = [Path(r).expanduser().resolve() for r in roots]
    candidate = Path(path)
    candidate = (candidate if candidate.is_absolute() else resolved_roots[0] / candidate).resolve()
    if not any(candidate.is_relative_to(root) for root in resolved_roots):
        raise HTTPException(403, "this path is outside the directories the server may read for verify-model")
    if not candidate.exists():
        raise HTTPException(404, f"{path} does not exist under the server's verify roots")
    return candidate


def add_verify_route(app: FastAPI, detector, config: ServiceConfig, bearer, errors: dict) -> None:
    """Register POST /v1/verify-model on ``app`` for the key(s) of ``detector``."""
    keys = {d.key.key_id: d.key for d in getattr(detector, "detectors", [detector])}

    @functools.cache
    def base_weights():
        from openstamp.provenance.readers import read_weights

        return read_weights(config.verify_base)

    def run(path: Path, key, permutations: int) -> dict:
        from openstamp.provenance import verify_model

        return verify_model(path, key, base_weights(), n_permutations=permutations).to_dict()

    @app.post(
        "/v1/verify-model", dependencies=[Security(bearer)], responses={**errors, 404: {"description": "no such path"}}
    )
    async def v1_verify_model(body: VerifyRequest) -> dict:
        """Is the checkpoint at ``path`` a derivative of this key's release? p-value, statistic, share."""
        if not config.verify_roots or config.verify_base is None:
            raise HTTPException(
                403, "this server does not verify checkpoints (openstamp serve --verify-root DIR --verify-base MODEL)"
            )
        path = allowed_path(body.path, config.verify_roots)
        if body.key_id is None and len(keys) > 1:
            raise HTTPException(400, f"this server holds several keys: give key_id (one of {', '.join(keys)})")
        key = keys.get(body.key_id) if body.key_id else next(iter(keys.values()))
        if key is None:
            raise HTTPException(400, f"this server holds no key {body.key_id}")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, run, path, key, body.permutations)
        except FileNotFoundError as err:
            raise HTTPException(404, str(err).splitlines()[0]) from None
        except (ValueError, OSError) as err:
            raise HTTPException(400, f"could not verify this checkpoint: {str(err).splitlines()[0]}") from None
