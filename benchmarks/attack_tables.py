"""docs/results.md's tables of attacks (benchmarks/render.py registers them): paraphrase at equal cost, the
projection under paraphrase, and the durability attacks at default strengths and at equal cost."""

from __future__ import annotations

from pathlib import Path
from statistics import fmean

from common import TPR, exact, rate, read, table, variant_name

# the default key of 0.2.0 (reference_runs.sh's default_attacks) is attacked in its own eval, where its method is
# named openstamp-nosem: its files are kept in a folder of this name and shown under the name the sweep's tables give it
DEFAULT_FOLDER, DEFAULT_NAME = "default", variant_name("openstamp-nosem", 4, True)


def _attacks(folder: Path) -> list[dict]:
    """The attack results in ``folder``, then the default key's (in its subfolder), renamed."""
    attacks = [read(f) for f in sorted(folder.glob("*.json"))]
    for a in (read(f) for f in sorted((folder / DEFAULT_FOLDER).glob("*.json"))):
        for run in a["runs"]:
            run["method"] = DEFAULT_NAME
        attacks.append(a)
    return attacks


# -- what survives paraphrase


def pooled_paraphrase(attacks: list[dict]) -> list[str]:
    """Per prompt and method, every key's paraphrases that are not near-copies counted together: the rate flagged at
    p <= 0.01, against the 1% threshold of human text cut to their lengths, and against the full-length one."""
    pooled: dict[tuple, dict] = {}
    for a in attacks:
        for run in a["runs"]:
            real, key = run["real"], (a["settings"].get("prompt", "paper"), run["method"])
            e = pooled.setdefault(key, {"keys": set(), "strengths": set(), "paraphrased": 0})
            e["keys"].add(run["seed"])
            e["strengths"].add(run["strength"])
            e["paraphrased"] += a["quality"][run["generations"]]["n"]
            rates = {"full": real["tpr_at_1pct_fpr_after"], "p": real.get("flagged_at_p_0.01")}
            rates["cut"] = (real.get("human_cut") or {}).get(TPR)
            for k, value in rates.items():
                if value is not None and real["n"]:
                    hits, n = e.get(k, (0, 0))
                    e[k] = (hits + round(value * real["n"]), n + real["n"])
    rows = []
    for (prompt, method), e in pooled.items():
        strengths = "/".join(f"{x:g}" for x in sorted(e["strengths"]))
        kept = f"{e['full'][1] if 'full' in e else 0} of {e['paraphrased']}"
        cells = [exact(*e[k]) if k in e else "-" for k in ("p", "cut", "full")]
        rows.append([prompt, method, strengths, str(len(e["keys"])), kept, *cells])
    header = ["prompt", "method", "strength", "keys", "kept", "at p <= 0.01", "at their lengths", "full-length thr."]
    return table(header, rows, 2)


def paraphrase(root: Path, cost: float) -> list[str]:
    """Every method after paraphrase at the strength nearest ``cost`` own PPL (paraphrase64/cost/, keys pooled)."""
    attacks = _attacks(root / "paraphrase64" / "cost")
    return pooled_paraphrase([a for a in attacks if a["settings"].get("at_cost") == cost])


def _cell(s: dict, key: str = TPR) -> tuple:
    stat = s[key]
    return (stat["mean"] if isinstance(stat, dict) else stat), (s.get("ppl") or {}).get("mean")


def _attack_rows(r: dict) -> list[tuple[str, str, dict]]:
    """(attack, setting, {method: (TPR, ppl)}) for each attacked setting of one durability results file."""
    kind, summary, s = r["attack"], r.get("summary", []), r["settings"]

    def by(key: str, value) -> dict:
        return {x["method"]: _cell(x) for x in summary if x[key] == value}

    if kind == "edit":
        setting = f"{s['delete']:.0%} deleted, {s['substitute']:.0%} substituted"
        return [("edit", setting, {x["method"]: _cell(x, "tpr_at_1pct_fpr_after") for x in summary})]
    if kind == "quantize":
        out = []
        for label in dict.fromkeys(x["scheme"] for x in summary if x["scheme"] != "unquantized"):
            info = r.get("quantization", {}).get(label, {})
            head = "lm_head quantized" if info.get("head_quantized") else "float lm_head"
            out.append(("quantize", f"{label.split('+')[0].upper()} ({head})", by("scheme", label)))
        return out
    if kind == "merge":
        other = "the base" if s.get("with_model") is None else "a fine-tune"
        return [
            (
                f"merge with {other}",
                f"{how}, t {t:g}",
                {x["method"]: _cell(x) for x in summary if (x["merge"], x["t"]) == (how, t)},
            )
            for how in dict.fromkeys(x["merge"] for x in summary)
            for t in sorted({x["t"] for x in summary if x["merge"] == how and x["t"] > 0})
        ]
    if kind == "prune":
        head = ", lm_head too" if s.get("include_head") else ""
        return [
            ("prune", f"{s['pruner']} {p:.0%}{head}", by("sparsity", p))
            for p in sorted({x["sparsity"] for x in summary if x["sparsity"] > 0})
        ]
    if kind == "instruct":
        steps = sorted({x["step"] for x in summary if x["step"] > 0})
        return [("instruction tuning", f"{s['mode']}, step {n}", by("step", n)) for n in steps]
    return []


def durability(root: Path) -> list[str]:
    """The attacks on the current releases at their default strengths that take some method below TPR 1: TPR@1%FPR
    and the attacked model's own held-out perplexity where the attack measures it (durability/attacks/)."""
    order = ("edit", "quantize", "merge", "prune", "instruct")
    attacks = [read(f) for f in sorted((root / "durability" / "attacks").glob("*.json"))]
    attacks = sorted((a for a in attacks if a.get("attack") in order), key=lambda a: order.index(a["attack"]))
    none = {
        x["method"]: _cell(x)
        for a in attacks
        if a["attack"] in ("merge", "prune")
        for x in a["summary"]
        if not x.get("t", x.get("sparsity"))
    }
    attacked = [row for a in attacks for row in _attack_rows(a) if any(v[0] < 1 for v in row[2].values())]
    rows = [("none", "the releases", none), *attacked]
    methods = list(dict.fromkeys(m for *_, values in rows for m in values))
    body = [
        [kind, setting]
        + [
            c
            for m in methods
            for c in (rate(values.get(m, (None,))[0]), f"{values[m][1]:.1f}" if values.get(m, (0, None))[1] else "-")
        ]
        for kind, setting, values in rows
    ]
    return table(["attack", "setting", *(f"{m}: {c}" for m in methods for c in ("TPR", "ppl"))], body, 2)


def durability_cost(root: Path, cost: float, folder: str = "robust_cost") -> list[str]:
    """Each attack at the strength nearest ``cost`` own PPL (in ``folder``; robust_cost/equal/ holds the shipping
    default's runs): the mean TPR@1%FPR over the keys (how many in brackets); 'none' is each run's own completions
    before the token edits."""
    cells: dict[str, dict[str, dict[str, float]]] = {"none": {}}  # setting -> method -> run (a key) -> TPR
    for a in _attacks(root / folder):
        if a["settings"]["at_cost"] != cost:
            continue
        s, kind = a["settings"], a["attack"]
        for run in a["runs"]:
            if kind == "edit":
                cells["none"].setdefault(run["method"], {})[run["run"]] = run["tpr_at_1pct_fpr_before"]
                label, value = f"edit: {s['delete']:.0%} deleted, {s['substitute']:.0%} substituted", run["after"][TPR]
            elif kind == "quantize" and run["scheme"] != "unquantized":
                label, value = f"quantize: {run['scheme'].upper()}", run[TPR]
            elif kind == "merge" and run["t"] > 0:
                label, value = f"merge with the base: {run['merge']}, t {run['t']:g}", run[TPR]
            elif kind == "prune" and run["sparsity"] > 0:
                label, value = f"prune: {s['pruner']} {run['sparsity']:.0%}", run[TPR]
            elif kind == "finetune" and run["step"] == s["steps"]:
                label, value = f"fine-tune: {s['mode']}, {s['steps']} steps", run[TPR]
            else:
                continue
            cells.setdefault(label, {}).setdefault(run["method"], {})[run["run"]] = value
    methods = list(dict.fromkeys(m for by in cells.values() for m in by))
    rows = [
        [label, *(f"{fmean(by[m].values()):.3f} ({len(by[m])})" if m in by else "-" for m in methods)]
        for label, by in cells.items()
    ]
    return table(["attack", *methods], rows)
