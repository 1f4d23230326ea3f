"""Tick marks that cannot be misread: on a log axis, matplotlib's own locators label a flat curve
with one rounded value five times (12.4, 12.4, ...) or a range of 8.75-11.74 with only 9 and 10.
Here every axis gets at least MIN_TICKS labels, each one the exact value of its tick (so no two are
equal), spread over the axis, and not overlapping at the size the axis is drawn.

Candidate tick sets, coarse to fine: every n-th power of the base; a few multiples of each power
(1-2-5 per decade, 1-1.5 per octave, ...); evenly spaced steps of 1, 2, 2.5 or 5 x 10^k (what a
narrow range needs, where a log axis is nearly linear). The chosen set leaves no stretch of the axis
wider than MAX_GAP unlabelled where some set can, and has about TARGET ticks.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from matplotlib import rcParams
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import Formatter, Locator, LogLocator, MaxNLocator, NullLocator, ScalarFormatter

MIN_TICKS, TARGET, MAX_TICKS = 4, 6, 10
# share of the axis (in log space) that may lie between two labels; wider on a length axis, whose
# values sit at powers of two, where its labels belong
MAX_GAP = {10: 0.25, 2: 0.35}
# multiples of each power of the base that may be labelled, coarse to fine
MULTIPLES = {10: ((1, 3), (1, 2, 5), (1, 2, 3, 5, 7), (1, 1.5, 2, 3, 5, 7), (1, 2, 3, 4, 5, 6, 7, 8, 9),
                  (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)),
             2: ((1, 1.5), (1, 1.25, 1.5, 1.75))}
STEPS = (5, 2.5, 2, 1)  # evenly spaced ticks: step = s x 10^k


class Ticks(NamedTuple):
    values: list[float]
    labels: list[str]


def exact_label(value: float, decimals: int | None = None) -> str:
    """The value written with `decimals` decimals, or else with as few as represent it exactly:
    plain numbers from 1e-4 to a million, 1e+06 style beyond (a power of the base or a multiple of
    one, exact in a few digits)."""
    if decimals is not None:
        return f"{value:.{decimals}f}"
    if value and not 1e-4 <= abs(value) < 1e6:
        return f"{value:.6g}"
    decimals = next((d for d in range(13) if abs(round(value, d) - value) <= 1e-9 * max(1.0, abs(value))), 12)
    return f"{value:.{decimals}f}"


def _inside(values, low: float, high: float) -> list[float]:
    tolerance = 1e-9 * max(abs(low), abs(high))
    return sorted({v for v in values if low - tolerance <= v <= high + tolerance})


def candidates(low: float, high: float, base: int) -> list[Ticks]:
    """Every tick set considered for a log axis from `low` to `high` (both > 0)."""
    first, last = math.floor(math.log(low, base)) - 1, math.ceil(math.log(high, base)) + 1
    powers = range(first, last + 1)
    sets = []
    for every in (8, 4, 3, 2, 1):
        values = _inside((float(base) ** k for k in powers if k % every == 0), low, high)
        sets.append(Ticks(values, [exact_label(v) for v in values]))
    for multiples in MULTIPLES[base]:
        values = _inside((m * float(base) ** k for k in powers for m in multiples), low, high)
        sets.append(Ticks(values, [exact_label(v) for v in values]))
    top = math.floor(math.log10(high - low)) if high > low else math.floor(math.log10(high))
    for exponent in range(top + 1, top - 4, -1):
        for s in STEPS:
            step = s * 10.0 ** exponent
            k0, k1 = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
            if not 1 <= k1 - k0 + 1 <= 4 * MAX_TICKS:
                continue
            decimals = max(0, -exponent + (1 if s == 2.5 else 0))  # 2.5 x 10^k needs one digit more
            values = [k * step for k in range(k0, k1 + 1) if k * step > 0]
            sets.append(Ticks(values, [exact_label(v, decimals) for v in values]))
    return [t for t in sets if t.values]


def _largest_gap(values: list[float], low: float, high: float) -> float:
    """The widest unlabelled stretch of the axis (ends included), as a share of the axis in log space."""
    logs = [math.log(low)] + [math.log(v) for v in values] + [math.log(high)]
    span = logs[-1] - logs[0] or 1.0
    return max(b - a for a, b in zip(logs, logs[1:])) / span


def _overlap(ticks: Ticks, low: float, high: float, length_px: float, extent: Callable[[str], float]) -> float:
    """How far the most crowded pair of labels overlaps (px; <= 0: none)."""
    span = math.log(high) - math.log(low) or 1.0
    at = [(math.log(v) - math.log(low)) / span * length_px for v in ticks.values]
    return max([(extent(a) + extent(b)) / 2 - (y - x)
                for (x, a), (y, b) in zip(zip(at, ticks.labels), zip(at[1:], ticks.labels[1:]))] or [0.0])


def choose(low: float, high: float, base: int = 10, length_px: float | None = None,
           extent: Callable[[str], float] = lambda label: 0.0) -> Ticks:
    """The tick set for a log axis from `low` to `high`, drawn `length_px` long, a label taking
    `extent(label)` px along it: among the sets of MIN_TICKS..MAX_TICKS labels that do not overlap,
    the one with no gap wider than MAX_GAP (else the smallest largest gap) and about TARGET labels;
    where none fits, the set of at least MIN_TICKS that overlaps least."""
    low, high = min(low, high), max(low, high)
    options = candidates(low, high, base)
    overlap = {id(t): _overlap(t, low, high, length_px, extent) if length_px else 0.0 for t in options}
    fitting = [t for t in options if MIN_TICKS <= len(t.values) <= MAX_TICKS and overlap[id(t)] <= 0]
    if fitting:
        return min(fitting, key=lambda t: (max(round(_largest_gap(t.values, low, high), 2), MAX_GAP[base]),
                                           abs(len(t.values) - TARGET), len(t.values)))
    enough = [t for t in options if len(t.values) >= MIN_TICKS] or options
    return min(enough, key=lambda t: (overlap[id(t)], len(t.values)))


def _label_extent(axis, label: str) -> float:
    """Pixels a tick label takes along its axis (its height on y, its width on x), with a gap."""
    name = "ytick.labelsize" if axis.axis_name == "y" else "xtick.labelsize"
    size_px = FontProperties(size=rcParams[name]).get_size_in_points() * axis.get_figure(root=True).dpi / 72
    return 1.2 * size_px if axis.axis_name == "y" else (0.62 * len(label) + 0.8) * size_px


class ReadableLogLocator(Locator):
    """Ticks of `choose` for a log axis; the labels it chose go to ExactFormatter."""

    def __init__(self, base: int = 10):
        self.base, self.labels = base, {}

    def __call__(self):
        low, high = self.axis.get_view_interval()
        bbox = self.axis.axes.bbox
        length = bbox.height if self.axis.axis_name == "y" else bbox.width
        return self._ticks(low, high, length if length > 1 else None)

    def tick_values(self, vmin, vmax):
        return self._ticks(vmin, vmax, None)

    def nonsingular(self, vmin, vmax):
        """Limits around a single value: +-5% (a flat curve's point), as on a linear axis; limits
        that are not positive: as matplotlib's log axes have them."""
        if vmin > 0 and vmax > 0:
            return super().nonsingular(vmin, vmax)
        return LogLocator(self.base).nonsingular(vmin, vmax)

    def _ticks(self, low, high, length_px):
        if not (low > 0 and high > 0 and math.isfinite(low) and math.isfinite(high)):
            return []
        ticks = choose(low, high, self.base, length_px,
                       (lambda label: _label_extent(self.axis, label)) if self.axis is not None else lambda label: 0.0)
        self.labels = dict(zip(ticks.values, ticks.labels))
        return ticks.values


class ExactFormatter(Formatter):
    """The label the locator chose for a tick (else the value written exactly)."""

    def __init__(self, locator: ReadableLogLocator):
        self.locator = locator

    def __call__(self, x, pos=None):
        for value, label in self.locator.labels.items():
            if abs(value - x) <= 1e-9 * max(1.0, abs(x)):
                return label
        return exact_label(x)


def readable_log_axis(axis, base: int = 10) -> None:
    """A log axis with `choose`'s labels and no minor ticks (every grid line is labelled)."""
    locator = ReadableLogLocator(base)
    axis.set_major_locator(locator)
    axis.set_major_formatter(ExactFormatter(locator))
    axis.set_minor_locator(NullLocator())


def readable_linear_axis(axis) -> None:
    """A linear axis with at least MIN_TICKS labels at steps of 1, 2, 2.5 or 5 x 10^k, written with
    the decimals the step needs and no offset (a label reads as its value)."""
    axis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], min_n_ticks=MIN_TICKS))
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_powerlimits((-4, 6))
    axis.set_major_formatter(formatter)
