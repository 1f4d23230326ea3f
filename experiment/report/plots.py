"""What every report's figure shares: a figure without a display; axes whose tick labels are exact,
distinct and enough (experiment/report/ticks.py), lengths in powers of two; one style per series
(colour and marker per series, line style per run); the training lengths marked; legends beside
the axes; saving that keeps everything on the image (the canvas grows to hold a long legend,
nothing is cut off at its edges); and labels that render in any script: where matplotlib finds an
installed font with CJK glyphs it is the fallback of the default one, and a character that no font
in use draws is written as its code (\\u5b9e), so two runs' labels never differ only in empty boxes."""
from __future__ import annotations

import functools
import io
import pathlib
import textwrap
from typing import Iterable

import matplotlib
from matplotlib import font_manager, ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ft2font import FT2Font
from matplotlib.text import Text

from experiment.report import ticks
from experiment.store import files

DPI = 120
PAD_INCHES = 0.15  # blank margin around everything drawn
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES = ("-", "--", ":", "-.", (0, (8, 2, 2, 2, 2, 2)), (0, (10, 3)), (0, (1, 3)), (0, (5, 1, 1, 1)))
PUBLISHED = (0, (2, 1))  # the paper's curves: a line style no run has


CJK_PROBE = "\u4e00"  # a font that draws it draws Chinese, and as a rule Japanese and Korean too


@functools.cache
def cjk_fallback() -> str | None:
    """The family of an installed font with CJK glyphs (matplotlib's font list; its bundled fonts
    have none), or None."""
    bundled = pathlib.Path(matplotlib.get_data_path()).resolve()
    for entry in font_manager.fontManager.ttflist:
        if pathlib.Path(entry.fname).resolve().is_relative_to(bundled):
            continue
        try:
            if ord(CJK_PROBE) in FT2Font(entry.fname).get_charmap():
                return entry.name
        except (OSError, RuntimeError, ValueError):
            continue
    return None


def font_families() -> list[str]:
    """matplotlib's default family, then the CJK fallback where there is one."""
    return ["sans-serif"] + ([cjk_fallback()] if cjk_fallback() else [])


@functools.cache
def _drawn_characters(families: tuple[str, ...]) -> frozenset[int]:
    """The code points the fonts of `families` draw."""
    points: set[int] = set()
    for family in families:
        path = font_manager.findfont(font_manager.FontProperties(family=[family]), fallback_to_default=True)
        points.update(FT2Font(path).get_charmap())
    return frozenset(points)


def drawable(text: str) -> str:
    """`text` with every character that no font in use draws written as its code (\\u5b9e)."""
    drawn = _drawn_characters(tuple(font_families()))
    return "".join(c if c.isspace() or ord(c) in drawn else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF
                   else f"\\U{ord(c):08x}" for c in text)


def drawable_texts(fig: Figure) -> None:
    """Every text of `fig` (titles, labels, legends, fixed tick labels) made `drawable`."""
    for text in fig.findobj(Text):
        if text.get_text() != drawable(text.get_text()):
            text.set_text(drawable(text.get_text()))
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatter = axis.get_major_formatter()
            if isinstance(formatter, ticker.FixedFormatter):
                formatter.seq = [drawable(str(label)) for label in formatter.seq]


def figure(size: tuple[float, float]) -> Figure:
    """A figure drawn off screen (no display needed), in `font_families`."""
    matplotlib.rcParams["font.family"] = font_families()
    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def panels(keys: list, width: float = 11, height: float = 4.5):
    """A figure with one panel per key, stacked: (figure, {key: Axes})."""
    fig = figure((width, height * max(1, len(keys))))
    axes = fig.subplots(max(1, len(keys)), 1, squeeze=False)
    return fig, dict(zip(keys, axes[:, 0]))


def save(fig: Figure, path: str | pathlib.Path) -> pathlib.Path:
    """Lay the figure out and write it; legends placed beside the axes are outside the layout (the
    axes keep their width) and inside the saved image, which is cut to what is drawn plus a margin."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    drawable_texts(fig)
    fig.tight_layout()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return write(fig, path, dpi=DPI, bbox_inches="tight", pad_inches=PAD_INCHES, bbox_extra_artists=legends or None)


def write(fig: Figure, path: str | pathlib.Path, **savefig) -> pathlib.Path:
    """The figure drawn in memory, then written whole: a full device names the file and the size it
    needs (experiment/store/files.py), not `a file`."""
    path, image = pathlib.Path(path), io.BytesIO()
    fig.savefig(image, format=path.suffix[1:] or "png", **savefig)
    files.write_bytes_atomically(path, image.getvalue())
    return path


def style(series: int, run: int = 0) -> dict:
    """Plot keywords of one series: its own colour and marker (unique up to 100 series in a panel),
    the line style of its run."""
    return {"color": f"C{series % 10}", "marker": MARKERS[(series + series // 10) % len(MARKERS)],
            "ls": LINESTYLES[run % len(LINESTYLES)]}


def format_length_axis(ax) -> None:
    """x: log base 2, labels at powers of two (64, 128, ...), halves between them where a short
    range needs more than three."""
    ax.set_xscale("log", base=2)
    ticks.readable_log_axis(ax.xaxis, base=2)


def format_ppl_axis(ax) -> None:
    """y: log scale, at least four exact, distinct labels whatever the range (call after plotting)."""
    ax.set_yscale("log")
    ticks.readable_log_axis(ax.yaxis, base=10)


def format_linear_axis(axis) -> None:
    """A linear axis (losses, accuracies, colour bars) with at least four labels, no offset."""
    ticks.readable_linear_axis(axis)


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
    ax.grid(True, which="major", alpha=0.3)


def legend_beside(ax) -> None:
    """The legend to the right of the axes (long labels do not cover the curves); `save` widens the
    image to hold it instead of narrowing the axes."""
    legend = ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    legend.set_in_layout(False)


def wrap(text: str, width: int) -> str:
    """Titles and labels longer than `width` characters on several lines (a small figure)."""
    return "\n".join(textwrap.wrap(text, width, break_long_words=False)) or text
