"""Helpers shared by the benchmark scripts (run them from the repository root)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
DEMO = Path("runs/demo")


def ensure_key(model_dir: Path, key_dir: Path, profile: str = "small") -> None:
    """Build a watermarked checkpoint and key with ``openstamp embed`` if they are missing."""
    if (model_dir / "config.json").exists() and (key_dir / "key.json").exists():
        return
    cmd = [
        sys.executable,
        "-m",
        "openstamp.cli",
        "embed",
        "--out",
        str(model_dir),
        "--key",
        str(key_dir),
        "--profile",
        profile,
        "--overwrite",
        "--quiet",
    ]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def saved_key(
    directory: Path,
    model,
    tokenizer,
    *,
    model_spec: str,
    secret: bytes,
    profile: str = "default",
    corpus: str = "wikipedia",
    states=None,
):
    """(the key saved in ``directory``, states): built there first when absent, with ``secret`` on the key half of
    ``corpus``, its re-tied release fingerprinted in it. ``states`` are reused (S does not depend on the secret) and
    returned, collected here when first needed."""
    from openstamp import load_documents, load_profile, split_documents
    from openstamp.embed.build import build_key
    from openstamp.embed.states import collect_states
    from openstamp.key.key import WatermarkKey
    from openstamp.model.patch import apply_watermark, revert_watermark

    if (directory / "key.json").exists():
        return WatermarkKey.load(directory), states
    cfg = load_profile(profile)
    docs = split_documents(load_documents(corpus), "key")
    if states is None:
        states = collect_states(model, tokenizer, docs, cfg.states, progress=False)
    began = time.perf_counter()
    key = build_key(model, tokenizer, docs, cfg, secret=secret, progress=False, states=states)
    apply_watermark(model, key, "retie", source=model_spec)  # records both heads' fingerprints in the key
    revert_watermark(model, key)
    key.save(directory, overwrite=True)
    print(f"[keys] {directory.name}: built {key.key_id} in {time.perf_counter() - began:.0f} s", flush=True)
    return key, states


def add_release_arguments(parser) -> None:
    """--model, --key: a watermarked release and its key (the demo's, built with the small profile if missing)."""
    parser.add_argument("--model", type=Path, default=DEMO / "model")
    parser.add_argument("--key", type=Path, default=DEMO / "key")


def load_release(args):
    """The release of ``--model`` in float32 (eval mode), its tokenizer and ``--key``; torch seeded with 0."""
    import torch
    from transformers import AutoModelForCausalLM

    from openstamp import WatermarkKey
    from openstamp.model.load import load_tokenizer

    ensure_key(args.model, args.key)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    return model, load_tokenizer(str(args.model)), WatermarkKey.load(args.key)


def timed(fn, repeats: int = 3) -> list[float]:
    """Wall seconds of ``repeats`` calls after one warm-up."""
    fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def interleaved(fns: dict, repeats: int = 3) -> dict[str, float]:
    """Median seconds of each function, run in turn A B C A B C ... so drift hits all alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def write_result(name: str, data: dict) -> Path:
    from openstamp.runtime import versions
    from openstamp.storage import atomic_write_text

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"benchmark": name, "versions": versions(), **data}
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")  # key order kept: summaries read it in order
    print(f"wrote {path}")
    return path


def claim_run(out: Path, settings: dict, free: tuple[str, ...] = ()) -> dict:
    """Record ``settings`` (JSON-able values) in ``out/settings.json``, or refuse when ``out`` already holds a run
    whose settings differ in any field but ``free`` (those a re-run may change, such as which sources it adds).
    Returns the settings as written: what the result should record."""
    from openstamp.storage import atomic_write_json, read_json

    settings = json.loads(json.dumps(settings, default=str))
    path = out / "settings.json"
    if path.exists():
        before = read_json(path, "settings")
        keys = (before.keys() | settings.keys()) - set(free)
        changed = sorted(k for k in keys if before.get(k) != settings.get(k))
        if changed:
            raise SystemExit(f"{out} holds a run with other settings ({', '.join(changed)}); choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, settings)
    return settings


def heldout_windows(tokenizer, n: int, prompt_tokens: int, new_tokens: int, exclude: set[str] = frozenset()):
    """``n`` (prompt ids, human continuation ids) windows from held-out news and Wikipedia, interleaved.

    Documents whose sha256 is in ``exclude`` (those that built a key) are skipped.
    """
    from openstamp import load_documents, split_documents
    from openstamp.model.text import prompt_windows

    groups = []
    for spec in ("news", "wikipedia"):
        docs = [d.text for d in split_documents(load_documents(spec), "heldout") if d.sha256 not in exclude]
        groups.append(prompt_windows(tokenizer, docs, prompt_tokens, new_tokens))
    mixed = [w for pair in zip(*groups, strict=False) for w in pair] + groups[1][len(groups[0]) :]
    if len(mixed) < n:
        raise SystemExit(f"only {len(mixed)} held-out windows of {prompt_tokens}+{new_tokens} tokens; lower --n")
    return mixed[:n]


VARIANTS = "shrinkage"  # benchmarks/results/shrinkage/<method>-f<f>/: an OpenStamp method with selector shrinkage f


def kept_variants(r: dict, folder: Path) -> list[tuple[Path, dict, str, str, str]]:
    """Each kept variant of an OpenStamp method beside the sweep ``r`` (folder/../VARIANTS/*/results.json): its
    folder, its results, its method, its name (``variant_name``), and why it does not match the sweep's seeds, prompts
    and human text ('' where it does)."""
    from openstamp.lab.evaluation.shards import mismatch

    out = []
    for path in sorted((folder.parent / VARIANTS).glob("*/results.json")):
        v = read(path)
        method = v["config"]["methods"][0]
        settings = v["config"]["method_settings"][method]
        name = variant_name(method, settings["shrinkage"], settings.get("centre", False), settings.get("gamma", 0.25))
        same = {**v, "config": {**v["config"], **{k: r["config"][k] for k in ("methods", "method_settings", "grids")}}}
        why = mismatch(r, same) or ("other seeds" if v["config"]["seeds"] != r["config"]["seeds"] else "")
        out.append((path.parent, v, method, name, why))
    return out


def sweep(root: Path, variants: bool = True) -> dict:
    """The sweep's results, with each matching shrinkage variant's points as a method '<method> (shrinkage f)'."""
    r = read(root / "sweep" / "results.json")
    if not variants:
        return r
    out = {**r, "summary": list(r["summary"]), "length_curve": list(r.get("length_curve", []))}
    for _, v, method, name, why in kept_variants(r, root / "sweep"):
        if not why:
            out["summary"] += [{**s, "method": name} for s in v["summary"] if s["method"] == method]
            out["length_curve"] += [{**row, "method": name} for row in v["length_curve"] if row["method"] == method]
    return out


def variant_name(method: str, shrinkage: float, centre: bool, gamma: float = 0.25) -> str:
    """How results recorded before 0.3.0 (every kept one) named a variant of an OpenStamp method (their names:
    openstamp-nosem, openstamp): '<method> (shrinkage f)', '<method> (shrinkage f, centred)', and ', gamma g' before
    the bracket closes where gamma is not 0.25. Tables show it as ``shown`` names it."""
    return (
        f"{method} (shrinkage {shrinkage:g}"
        + (", centred" if centre else "")
        + (f", gamma {gamma:g})" if gamma != 0.25 else ")")
    )


# an OpenStamp method's name in results recorded before 0.3.0, with its kept variant's settings (variant_name)
RECORDED = re.compile(r"(openstamp(?:-nosem)?)(?: \(shrinkage ([0-9.]+)(, centred)?(?:, gamma ([0-9.]+))?\))?")


def shown(name: str) -> str:
    """A method as tables name it now, from its name in a result recorded before 0.3.0: the default P = I method
    (then openstamp-nosem) is ``openstamp``, the paper's projected one (then openstamp) ``openstamp-projected``, each
    with the settings where they are not that method's defaults (``label``), e.g. 'openstamp (shrinkage 0,
    uncentred)' for the plain openstamp-nosem of 0.1.0. Any other text is returned as it is."""
    from openstamp.lab.methods.openstamp import current_name, label

    found = RECORDED.fullmatch(name)
    if found is None:  # a recorded name and a note of the table's own, '<method> (per-token mean)'
        noted = re.fullmatch(r"(openstamp(?:-nosem)?) \((?!shrinkage)([^()]+)\)", name)
        if noted is None:
            return name
        now = shown(noted.group(1))
        return f"{now[:-1]}, {noted.group(2)})" if now.endswith(")") else f"{now} ({noted.group(2)})"
    old, shrinkage, centred, gamma = found.groups()
    now = label(current_name(old, None), {"shrinkage": float(shrinkage or 0), "centre": bool(centred)})
    if gamma is not None:
        now = f"{now[:-1]}, gamma {float(gamma):g})" if now.endswith(")") else f"{now} (gamma {float(gamma):g})"
    return now


def default_method(methods: list[str]) -> str | None:
    """The sweep's recorded name (before 0.3.0) of the key ``openstamp embed`` builds by default (its kept variant,
    or a plain method)."""
    from openstamp.config import load_profile

    cfg = load_profile("default")
    base = "openstamp" if cfg.projection.enabled else "openstamp-nosem"
    if cfg.selector.shrinkage == 0 and not cfg.green.centre:
        return base if base in methods else None
    name = variant_name(base, cfg.selector.shrinkage, cfg.green.centre, cfg.green.gamma)
    return name if name in methods else None


# -- markdown tables from results JSON (benchmarks/render.py)

COST, TPR = "own_ppl_change", "tpr_at_1pct_fpr"


READ: list[dict] = []  # every results file read since render.py last cleared it: what a table was measured with


def read(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    READ.append(data)
    return data


DEFAULT_SINCE = (0, 2, 0)  # the default profile is today's key (P = I, shrunk, centred) since 0.2.0; projected before


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def measured_with(reads: list[dict]) -> tuple[list[str], list[str]]:
    """The openstamp versions and the embedding profiles that results files record (settings.profile, profile or
    config.profile; an eval's methods carry theirs in their own settings and record none here)."""
    versions, profiles = set(), set()
    mapping = lambda x: x if isinstance(x, dict) else {}  # noqa: E731
    for data in map(mapping, reads):
        for holder in (data, mapping(data.get("eval"))):
            if version := mapping(holder.get("versions")).get("openstamp"):
                versions.add(version)
        settings, config = mapping(data.get("settings")), mapping(data.get("config"))
        profile = settings.get("profile") or data.get("profile") or config.get("profile")
        if isinstance(profile, str):
            profiles.add(profile)
    return sorted(versions, key=version_tuple), sorted(profiles)


def on_current_default(reads: list[dict]) -> bool:
    """Whether every file a table read was measured with the current default key: a package of 0.2.0 or later (when
    the default profile became today's) and, where a profile is recorded, the default profile."""
    versions, profiles = measured_with(reads)
    return bool(versions) and all(version_tuple(v) >= DEFAULT_SINCE for v in versions) and set(profiles) <= {"default"}


def caption(reads: list[dict]) -> str:
    """What a table's results were measured with: package versions and profiles ('default' before 0.2.0 was
    today's projected profile, so it reads 'default of 0.1.0')."""
    versions, profiles = measured_with(reads)
    text = f"openstamp {', '.join(versions) or '?'}"
    if profiles:
        old = any(version_tuple(v) < DEFAULT_SINCE for v in versions)
        named = [f"{p} of 0.1.0" if p == "default" and old else p for p in profiles]
        text += f"; profile {', '.join(named)}"
    return text


def with_caption(rows: list[str], reads: list[dict], historical: bool = False) -> list[str]:
    """A markdown table whose first header cell names what it was measured with (``caption``), and 'historical'
    where the page marks it so, without a line more."""
    cells = rows[0].split("|")
    note = caption(reads) + ("; historical" if historical else "")
    cells[1] = f" {cells[1].strip()} <sub>({note})</sub> "
    return ["|".join(cells), *rows[1:]]


def table(header: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """A markdown table: the first ``text_columns`` left-aligned, the rest (numbers) right-aligned; where the files
    read for it were recorded before 0.3.0's renaming, a cell that is a recorded OpenStamp method's name shows its
    name now (``shown``). Results of 0.3.0 and later already name methods as they are named now."""
    from openstamp.lab.methods.openstamp import RENAMED_IN

    versions, _ = measured_with(READ)
    if not versions or any(version_tuple(v) < RENAMED_IN for v in versions):
        header, rows = (
            [shown(h) for h in header],
            [[shown(cell) if isinstance(cell, str) else cell for cell in r] for r in rows],
        )
    rule = "|" + "---|" * text_columns + "---:|" * (len(header) - text_columns)
    return ["| " + " | ".join(header) + " |", rule, *("| " + " | ".join(r) + " |" for r in rows)]


def shown_row(line: str) -> str:
    """A markdown table row (made elsewhere, e.g. by the eval's report) with its cells as ``shown`` names them."""
    return "|".join(f" {shown(cell.strip())} " if cell.strip() else cell for cell in line.split("|"))


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def exact(hits: int, n: int) -> str:
    """A rate of ``hits`` in ``n`` texts with its Clopper-Pearson 95% interval."""
    from openstamp.detect.rates import clopper_pearson

    if not n:
        return "-"
    low, high = clopper_pearson(hits, n)
    return f"{hits / n:.3f} [{low:.2f}, {high:.2f}]"
