"""matplotlib without a display: a new figure, a PNG written through a temporary file, and the p-value QQ plot
that ``openstamp calibrate`` draws."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def new_figure(width: float = 5.5, height: float = 4.2, ncols: int = 1):
    """A figure and its axis (an array of ``ncols`` axes side by side when ncols > 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height))


def save_figure(fig, path: Path) -> Path:
    """Lay out, write ``path`` atomically (temporary file, then rename) and close the figure."""
    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def qq_plot(p_values: np.ndarray, path: str | Path, title: str) -> Path:
    """QQ plot of p-values against Uniform(0, 1), plus their histogram, as a PNG."""
    p = np.sort(np.asarray(p_values, dtype=np.float64))
    expected = (np.arange(1, len(p) + 1)) / (len(p) + 1)
    fig, (ax1, ax2) = new_figure(9, 4, ncols=2)
    ax1.plot(expected, p, ".", ms=3, label="observed")
    ax1.plot([0, 1], [0, 1], "k--", lw=1, label="uniform")
    ax1.set(xlabel="expected p (uniform)", ylabel="observed p", title="QQ plot")
    ax1.legend()
    ax2.hist(p, bins=20, range=(0, 1), color="tab:blue", alpha=0.8)
    ax2.axhline(len(p) / 20, color="k", ls="--", lw=1)
    ax2.set(xlabel="p-value", ylabel="texts", title="histogram")
    fig.suptitle(title)
    path = Path(path)
    save_figure(fig, path)
    return path
