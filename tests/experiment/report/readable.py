"""What every figure a report writes must satisfy, checked on the figure and on the saved PNG: tick
labels distinct, exact and at least four on every continuous axis, not overlapping; nothing drawn
at the edge of the image (what reaches the edge was cut off)."""
from __future__ import annotations

import pathlib

import matplotlib.image
import numpy as np
from matplotlib.ticker import FixedLocator

MIN_TICKS = 4


def tick_labels(axis) -> list[tuple[float, str, object]]:
    """(value, text, bounding box) of the labelled ticks inside the axis' view, drawn as saved."""
    renderer = axis.get_figure(root=True).canvas.get_renderer()
    low, high = sorted(axis.get_view_interval())
    out = []
    for tick in axis.get_major_ticks():
        label = tick.label1 if tick.label1.get_visible() else tick.label2  # label2: a colour bar's right side
        value = tick.get_loc()
        if label.get_visible() and label.get_text() and low - 1e-12 <= value <= high + 1e-12:
            out.append((value, label.get_text(), label.get_window_extent(renderer)))
    return out


def check_axis(axis, where: str, cells: bool = False) -> None:
    """Distinct labels that do not overlap; on a continuous axis also at least MIN_TICKS, each
    reading as its tick's value (`cells`: a heat map's rows or columns, which may be fewer)."""
    labels = tick_labels(axis)
    texts = [text for _, text, _ in labels]
    assert len(set(texts)) == len(texts), f"{where}: repeated tick labels {texts}"
    for (_, a, box_a), (_, b, box_b) in zip(labels, labels[1:]):
        assert not box_a.overlaps(box_b), f"{where}: tick labels {a!r} and {b!r} overlap"
    if cells:
        return
    assert len(texts) >= MIN_TICKS, f"{where}: only {texts} labelled"
    for value, text, _ in labels:
        shown = float(text.replace("\N{MINUS SIGN}", "-"))
        assert abs(shown - value) <= 1e-9 * max(1.0, abs(value)), f"{where}: label {text!r} at {value!r}"


def check_figure(fig, name: str = "figure") -> None:
    """check_axis on every axis that carries ticks (a colour bar's short side carries none); the
    axes of an image (heat map) label cells."""
    fig.canvas.draw()
    for i, ax in enumerate(fig.axes):
        for axis in (ax.xaxis, ax.yaxis):
            locator = axis.get_major_locator()
            if axis.get_visible() and not (isinstance(locator, FixedLocator) and len(locator.locs) == 0):
                check_axis(axis, f"{name}, axes {i} ({ax.get_title()[:40]!r}), {axis.axis_name}", bool(ax.images))


def check_png(path: str | pathlib.Path, margin: int = 3) -> None:
    """Nothing drawn within `margin` pixels of the saved image's edges (a cut legend, title or label
    reaches them)."""
    image = matplotlib.image.imread(str(path))[..., :3]
    edges = {"top": image[:margin], "bottom": image[-margin:], "left": image[:, :margin], "right": image[:, -margin:]}
    for side, pixels in edges.items():
        assert np.all(pixels > 0.99), f"{path}: something is drawn at the {side} edge (cut off)"
