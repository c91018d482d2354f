"""matplotlib without a display: a new figure, and a PNG written through a temporary file."""

from __future__ import annotations

from pathlib import Path


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
