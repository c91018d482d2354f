"""openstamp calibrate: LLR thresholds from held-out reference text, and a check of the p-values."""

from __future__ import annotations

import datetime as _dt
import shlex
import sys
from pathlib import Path

import typer
from rich.table import Table

from openstamp.cli.common import (
    CacheOption,
    DeviceOption,
    DtypeOption,
    console,
    friendly_errors,
    numbers,
    setup_logging,
)


@friendly_errors
def calibrate(
    model: str = typer.Option(..., "--model", "-m", help="the watermarked checkpoint (or the original model)"),
    key: Path = typer.Option(..., "--key", "-k", help="the key directory; the calibration is stored in it"),
    base: str | None = typer.Option(
        None, help="the original model beside the release, as `detect --base` takes it: the path you detect on"
    ),
    corpus: str = typer.Option(
        "wikipedia,news",
        help="comma-separated reference corpora: packaged names, hf: datasets, or your own domain's human text "
        "(a .txt, .jsonl or folder)",
    ),
    part: str = typer.Option(
        "heldout", help="heldout: the corpora's held-out half; all: every document (your own text, which built no key)"
    ),
    n: int = typer.Option(1000, help="reference texts"),
    length: int = typer.Option(200, help="tokens per reference text"),
    lengths: str | None = typer.Option(
        None,
        help="comma-separated lengths (e.g. 32,64,128,200): also store thresholds and measured FPRs "
        "(Clopper-Pearson intervals) per length; results then name each text's length band",
    ),
    fpr: str = typer.Option("0.001,0.01,0.05", help="comma-separated target false-positive rates"),
    report: Path | None = typer.Option(None, help="directory for calibration.json and the QQ plot"),
    store: bool = typer.Option(True, help="store the thresholds in the key's metadata"),
    batch_size: int = typer.Option(16, help="texts per forward pass"),
    dtype: str = DtypeOption,
    device: str = DeviceOption,
    cache_dir: Path | None = CacheOption,
    quiet: bool = typer.Option(False, help="no progress bar"),
) -> None:
    """Score reference human text, store LLR thresholds for target false-positive rates, check the p-values."""
    import numpy as np

    from openstamp.config import DetectConfig
    from openstamp.detect import Detector
    from openstamp.detect.calibrate import calibration_record, length_record, reference_texts, store_calibration
    from openstamp.detect.plots import qq_plot
    from openstamp.detect.rates import texts_needed
    from openstamp.runtime import versions
    from openstamp.storage import atomic_write_json

    setup_logging(quiet)
    alphas = [float(a) for a in fpr.split(",")]
    if not all(0 < a < 1 for a in alphas):
        raise ValueError(f"--fpr rates must lie between 0 and 1, not {fpr}")
    if n < texts_needed(min(alphas)):
        raise ValueError(
            f"--fpr {min(alphas):g} needs --n of at least {texts_needed(min(alphas))} reference texts (the threshold "
            f"is split conformal, and its rate holds only with n >= 1/alpha - 1); --n is {n}"
        )
    by_length = sorted(set(numbers(lengths, "lengths", int))) if lengths else []
    if by_length and by_length[0] < 2:
        raise ValueError("--lengths must be at least 2 tokens")
    config = DetectConfig(
        batch_size=batch_size,
        n_permutations=max(999, int(1 / min(alphas))),
        min_tokens=max(1, min([16, *(L // 2 for L in by_length)])),
    )
    if part not in ("heldout", "all"):
        raise ValueError(f"--part must be heldout or all, not {part!r}")
    detector = Detector.from_pretrained(
        model, str(key), config, dtype=dtype, device=device, cache_dir=cache_dir, base=base
    )
    exclude = {d["sha256"] for d in detector.key.meta.get("corpus", {}).get("documents", [])}
    corpora = [c.strip() for c in corpus.split(",") if c.strip()]
    texts = reference_texts(detector.tokenizer, corpora, n, length, exclude, part)
    results = detector.detect(texts, progress=not quiet)
    per_length = {}
    for L in by_length:  # without a BOS the first token is not scored: windows one longer score L tokens
        window = L + (0 if detector.bos else 1)
        windows = reference_texts(detector.tokenizer, corpora, n, window, exclude, part)
        scored = detector.detect(windows, progress=not quiet)
        ok = [r for r in scored if r.status == "ok"]
        p = np.array([r.p_value for r in ok if r.p_value is not None])
        per_length[str(L)] = length_record(np.array([r.score for r in ok]), p, alphas)
    reference = {
        "corpora": corpora,
        "part": part,
        "length": length,
        "model": model,
        "base": base,
        "backbone": detector.backbone,
        "key_id": detector.key.key_id,
        "n_permutations": config.n_permutations,
        "command": shlex.join(["openstamp", *sys.argv[1:]]),
        "versions": versions(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    record, p_values = calibration_record(results, alphas, reference)
    if per_length:
        record["by_length"] = per_length
    if store:
        store_calibration(key, record)
    if report is not None:
        report.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            report / "calibration.json",
            {**record, "p_values": p_values.tolist(), "scores": [r.score for r in results]},
        )
        qq_plot(p_values, report / "pvalues_qq.png", f"permutation p-values on {len(p_values)} reference texts")
    table = Table(title=f"calibration on {record['n_texts']} texts of {length} tokens ({detector.backbone} backbone)")
    for column in ("target FPR", "LLR threshold", "observed FPR of p-values"):
        table.add_column(column)
    for a in alphas:
        observed = record.get("p_value_observed_fpr", {}).get(f"{a:g}")
        table.add_row(
            f"{a:g}",
            threshold_cell(record["llr_thresholds"][f"{a:g}"], a),
            "" if observed is None else f"{observed:.4f}",
        )
    console.print(table)
    console.print(
        f"raw LLR on null text: mean {record['llr_null_mean']:+.3f}, sd {record['llr_null_sd']:.3f}; "
        f"KS test of p-values against uniform: p = {record.get('p_value_ks_uniform', float('nan')):.3g}"
    )
    if per_length:
        console.print(length_table(per_length, alphas))
    if store:
        console.print(f"thresholds stored in {key / 'key.json'}; use them with `openstamp detect --calibrated`")


def threshold_cell(tau: float | None, alpha: float) -> str:
    """A stored threshold, or why there is none (too few reference texts for ``alpha``)."""
    from openstamp.detect.rates import texts_needed

    return f"{tau:+.4f}" if tau is not None else f"none: needs {texts_needed(alpha)} texts"


def length_table(per_length: dict, alphas: list[float]) -> Table:
    """Per length and target FPR: the threshold and the measured FPRs with 95% Clopper-Pearson intervals."""
    table = Table(title="per-length calibration (measured FPR, 95% Clopper-Pearson interval)")
    for column in ("length", "texts", "target FPR", "LLR threshold", "FPR of the threshold", "FPR of p <= target"):
        table.add_column(column)

    def cell(rate: dict | None) -> str:
        return "" if rate is None else f"{rate['rate']:.4f} [{rate['low']:.4f}, {rate['high']:.4f}]"

    for L, rec in per_length.items():
        for a in alphas:
            name = f"{a:g}"
            table.add_row(
                L,
                str(rec["n_texts"]),
                name,
                threshold_cell(rec["llr_thresholds"][name], a),
                cell(rec.get("llr_threshold_fpr", {}).get(name)),
                cell(rec.get("p_value_fpr", {}).get(name)),
            )
    return table
