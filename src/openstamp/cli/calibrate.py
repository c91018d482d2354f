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
    setup_logging,
)


@friendly_errors
def calibrate(
    model: str = typer.Option(..., "--model", "-m", help="the watermarked checkpoint (or the original model)"),
    key: Path = typer.Option(..., "--key", "-k", help="the key directory; the calibration is stored in it"),
    corpus: str = typer.Option("wikipedia,news", help="comma-separated reference corpora (held-out parts are used)"),
    n: int = typer.Option(1000, help="reference texts"),
    length: int = typer.Option(200, help="tokens per reference text"),
    fpr: str = typer.Option("0.001,0.01,0.05", help="comma-separated target false-positive rates"),
    report: Path | None = typer.Option(None, help="directory for calibration.json and the QQ plot"),
    store: bool = typer.Option(True, help="store the thresholds in the key's metadata"),
    batch_size: int = typer.Option(16, help="texts per forward pass"),
    dtype: str = DtypeOption,
    device: str = DeviceOption,
    cache_dir: Path | None = CacheOption,
    quiet: bool = typer.Option(False, help="no progress bar"),
) -> None:
    """Score held-out human text, store LLR thresholds for target false-positive rates, check the p-values."""
    from openstamp.config import DetectConfig
    from openstamp.detect import Detector
    from openstamp.detect.calibrate import calibration_record, reference_texts, store_calibration
    from openstamp.plots import qq_plot
    from openstamp.storage import atomic_write_json
    from openstamp.watermark import versions

    setup_logging(quiet)
    alphas = [float(a) for a in fpr.split(",")]
    config = DetectConfig(batch_size=batch_size, n_permutations=max(999, int(1 / min(alphas))))
    detector = Detector.from_pretrained(model, str(key), config, dtype=dtype, device=device, cache_dir=cache_dir)
    exclude = {d["sha256"] for d in detector.key.meta.get("corpus", {}).get("documents", [])}
    corpora = [c.strip() for c in corpus.split(",") if c.strip()]
    texts = reference_texts(detector.tokenizer, corpora, n, length, exclude)
    results = detector.detect(texts, progress=not quiet)
    reference = {
        "corpora": corpora,
        "part": "heldout",
        "length": length,
        "model": model,
        "key_id": detector.key.key_id,
        "n_permutations": config.n_permutations,
        "command": shlex.join(["openstamp", *sys.argv[1:]]),
        "versions": versions(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    record, p_values = calibration_record(results, alphas, reference)
    if store:
        store_calibration(key, record)
    if report is not None:
        report.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            report / "calibration.json",
            {**record, "p_values": p_values.tolist(), "scores": [r.score for r in results]},
        )
        qq_plot(p_values, report / "pvalues_qq.png", f"permutation p-values on {len(p_values)} held-out texts")
    table = Table(title=f"calibration on {record['n_texts']} held-out texts of {length} tokens")
    for column in ("target FPR", "LLR threshold", "observed FPR of p-values"):
        table.add_column(column)
    for a in alphas:
        observed = record.get("p_value_observed_fpr", {}).get(f"{a:g}")
        table.add_row(
            f"{a:g}",
            f"{record['llr_thresholds'][f'{a:g}']:+.4f}",
            "" if observed is None else f"{observed:.4f}",
        )
    console.print(table)
    console.print(
        f"raw LLR on null text: mean {record['llr_null_mean']:+.3f}, sd {record['llr_null_sd']:.3f}; "
        f"KS test of p-values against uniform: p = {record.get('p_value_ks_uniform', float('nan')):.3g}"
    )
    if store:
        console.print(f"thresholds stored in {key / 'key.json'}; use them with `openstamp detect --calibrated`")
