"""Report helpers shared by the attacks: summaries over seeds, Markdown tables, plots, publishing.

``publish`` writes an attack's results.json, section.md and report.md to its output folder and
copies the section (with its PNGs) into ``<eval>/attacks/``, which ``write_report`` appends to
the evaluation's report.md.
"""

from __future__ import annotations

import datetime as _dt
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from openstamp.detect.plots import new_figure, save_figure  # noqa: F401  (the attacks import them from here)
from openstamp.lab.attacks.common import EvalRun, by_method
from openstamp.lab.evaluation.metrics import METRICS
from openstamp.lab.evaluation.report import write_report
from openstamp.runtime import versions
from openstamp.storage import atomic_write_json, atomic_write_text, read_json


def fmt(stat: dict | float | None, digits: int = 3) -> str:
    """A number, or ``mean ± sd`` for several seeds; '-' when missing."""
    if isinstance(stat, dict):
        if stat.get("mean") is None:
            return "-"
        text = f"{stat['mean']:.{digits}f}"
        return f"{text} ± {stat['sd']:.{digits}f}" if stat.get("sd") else text
    if stat is None or not np.isfinite(stat):
        return "-"
    return f"{stat:.{digits}f}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int = 1) -> list[str]:
    """A Markdown table; columns from ``numeric_from`` on are right-aligned."""
    align = ["---" if i < numeric_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def publish(
    out: Path,
    attack: str,
    title: str,
    body: list[str],
    plots: list[Path],
    results: dict,
    eval_dir: Path | None = None,
) -> Path:
    """Write results.json, section.md and report.md to ``out``; add the section to the eval report.

    results.json names the eval attacked by its ``created`` time too (``eval_created``), so that a summary that pairs
    the attack with a copy of that eval can tell it from the eval run again.

    The copy in ``<eval>/attacks/<out.name>.md`` links its PNGs (copied next to it) relative to the
    eval directory, because ``write_report`` appends it to ``<eval>/report.md``.
    """
    attacked = {}  # which eval was attacked, beyond its path: an eval run again into the same folder is another one
    if eval_dir is not None and (eval_dir / "results.json").exists():
        attacked = {"eval_created": read_json(eval_dir / "results.json", "evaluation results")["created"]}
    results = {
        "attack": attack,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        **attacked,
        **results,
    }
    atomic_write_json(out / "results.json", results)

    def section(prefix: str) -> str:
        images = [f"![{p.stem}]({prefix}{p.name})" for p in plots]
        return "\n".join([f"## Attack: {title}", "", *body, "", *images]).rstrip() + "\n"

    atomic_write_text(out / "section.md", section(""))
    atomic_write_text(out / "report.md", f"# OpenStamp attack: {attack}\n\n" + section(""))
    if eval_dir is not None:
        tag = out.name
        folder = eval_dir / "attacks"
        folder.mkdir(exist_ok=True)
        for p in plots:
            shutil.copyfile(p, folder / f"{tag}_{p.name}")
        atomic_write_text(folder / f"{tag}.md", section(f"attacks/{tag}_"))
        if (eval_dir / "results.json").exists():
            write_report(eval_dir)
    return out / "report.md"


def drop_section(eval_dir: Path, name: str) -> None:
    """Remove the section that an attack with ``--out .../<name>`` added to ``eval_dir``'s report (a trial run's),
    with the PNGs it links; ``write_report`` then leaves it out. The attack's own folder is left alone."""
    folder = eval_dir / "attacks"
    section = folder / f"{name}.md"
    if Path(name).name != name or not section.is_file():  # a folder's name, not a path out of attacks/
        present = sorted(p.stem for p in folder.glob("*.md"))
        raise ValueError(f"{eval_dir} has no attack section {name!r}; its sections: {', '.join(present) or 'none'}")
    links = [line[line.index("(") + 1 : -1] for line in section.read_text().splitlines() if line.startswith("![")]
    section.unlink()  # first: a report rendered now no longer links the images below
    for link in links:
        (eval_dir / link).unlink(missing_ok=True)


# -- the before/after comparison shared by the text attacks ---------------------------------------

COMPARED = tuple((m.label, m.name) for m in METRICS.values() if m.attack)  # results.json has more
# the title of the table of the rate at p <= 0.01 in the attacks' sections
AT_P_TITLE = "Rate at p <= 0.01 (needs no threshold, so it holds on shorter text; '-' for a detector without p-values):"
# the tables every weight attack's section opens with: (title, metric of its summary rows)
DETECTION_TABLES = (("TPR@1%FPR:", "tpr_at_1pct_fpr"), (AT_P_TITLE, "flagged_at_p_0.01"))


def titled_tables(tabulate: Callable[[str], list[str]], sections: Sequence[tuple[str, str]]) -> list[str]:
    """Each (title, metric) of ``sections`` as a blank line, its title, a blank line and ``tabulate(metric)``."""
    return [line for title, metric in sections for line in ("", title, "", *tabulate(metric))]


def negatives_note(ev: EvalRun) -> str:
    """How many human negatives there are, and whether TPR@1%FPR is resolution-limited."""
    n = len(ev.windows)
    note = f"Negatives: the eval run's {n} human continuations"
    if n < 100:
        note += " (fewer than 100, so the TPR@1%FPR threshold is the largest human score: resolution-limited)"
    return note + "."


def compare_row(run: dict, before: dict, after: dict) -> dict:
    """One run's detection before and after an attack (keys ``<metric>_before`` / ``_after``)."""
    row = {k: run[k] for k in ("run", "method", "strength", "seed")}
    for _, key in COMPARED:
        row[f"{key}_before"], row[f"{key}_after"] = before.get(key), after.get(key)  # None: no p-values
    row["after"] = after
    return row


def compare_summary(rows: list[dict]) -> list[dict]:
    keys = [f"{key}_{when}" for _, key in COMPARED for when in ("before", "after")]
    return by_method(rows, keys, extra=("strength",))


def compare_table(summary: list[dict], attacked: str = "attacked") -> list[str]:
    header = ["method", "strength"]
    for name, _ in COMPARED:
        header += [f"{name} original", f"{name} {attacked}"]
    rows = []
    for s in summary:
        cells = [s["method"], f"{s['strength']:g}"]
        for _, key in COMPARED:
            cells += [fmt(s[f"{key}_before"]), f"**{fmt(s[f'{key}_after'])}**"]
        rows.append(cells)
    return md_table(header, rows, numeric_from=1)


def compare_plot(summary: list[dict], path: Path, title: str, attacked: str = "attacked") -> Path:
    """Bars of TPR@1%FPR per method: the eval's text and the attacked text."""
    fig, ax = new_figure(max(5.0, 1.1 * len(summary) + 2), 3.8)
    x = np.arange(len(summary))
    for offset, when, label in ((-0.2, "before", "original"), (0.2, "after", attacked)):
        values = [s[f"tpr_at_1pct_fpr_{when}"]["mean"] or 0.0 for s in summary]
        errors = [s[f"tpr_at_1pct_fpr_{when}"]["sd"] or 0.0 for s in summary]
        ax.bar(x + offset, values, 0.4, yerr=errors, label=label)
    ax.set_xticks(x, [s["method"] for s in summary], rotation=20, fontsize=8)
    ax.set(ylim=(0, 1.05), ylabel="TPR @ 1% FPR (human negatives)", title=title)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
