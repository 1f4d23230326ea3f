"""What every report's figures share: a figure without a display, axes in powers of two and plain
log-scale labels, the training lengths marked, a legend beside the axes, and saving."""
from __future__ import annotations

import math
import pathlib
from typing import Iterable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

DPI = 120


def figure(size: tuple[float, float]) -> Figure:
    """A figure drawn off screen (no display needed)."""
    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def panels(keys: list, width: float = 11, height: float = 4.5):
    """A figure with one panel per key, stacked: (figure, {key: Axes})."""
    fig = figure((width, height * max(1, len(keys))))
    axes = fig.subplots(max(1, len(keys)), 1, squeeze=False)
    return fig, dict(zip(keys, axes[:, 0]))


def save(fig: Figure, path: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def plain(value: float, _pos=None) -> str:
    return str(int(round(value))) if abs(value - round(value)) < 1e-6 * max(1.0, value) else f"{value:.3g}"


def format_length_axis(ax) -> None:
    """x: log base 2, plain labels at powers of two (64, 128, ...)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(FuncFormatter(plain))
    ax.xaxis.set_minor_formatter(NullFormatter())


def format_ppl_axis(ax) -> None:
    """y: log scale with plain labels (10, 20, ...); call after plotting. Short ranges also label
    the ticks between powers of ten (e.g. 8, 9, 10, 12, 15, 20)."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    decades = math.log10(high / low)
    subs, labelled = next((s, lab) for limit, s, lab in (
        (0.5, (1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9), True), (1.2, (1.5, 2, 3, 4, 5, 6, 7, 8), True),
        (2.5, (2, 3, 5), True), (4, (2, 5), True), (math.inf, tuple(range(2, 10)), False)) if decades < limit)
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(plain))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_minor_formatter(FuncFormatter(plain) if labelled else NullFormatter())


def mark_train_lengths(ax, lengths: Iterable[int], *, label: str = "L", style: str = "--") -> None:
    """A gray vertical line at each training length, labelled at the top."""
    for length in sorted(set(lengths)):
        ax.axvline(length, color="gray", ls=style, lw=0.8 if style == "--" else 1)
        ax.text(length, 1.0, f" {label}={length}", transform=ax.get_xaxis_transform(), va="top",
                fontsize=8, color="gray")


def length_axes(ax, train_lengths: Iterable[int]) -> None:
    """Training lengths marked, x in powers of two, a light grid."""
    mark_train_lengths(ax, train_lengths)
    format_length_axis(ax)
    ax.grid(True, which="both", alpha=0.3)


def legend_beside(ax) -> None:
    """The legend to the right of the axes (long labels do not cover the curves)."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def color(i: int) -> str:
    return f"C{i % 10}"
