"""Inline SVG charts for the HTML report (no scripts, no external assets).

    bar_chart([Bar("ort", 5e-6, KIND_COLORS["vendor"], chosen=True), ...], log=True)
    share_chart([Bar("Conv", 0.82, "#3b7dd8", note="82% (2.4 ms)"), ...])
    curve_chart(times_by_trial, reference_s=5e-6)    # best time so far vs trials

Each row's label sits on its own line above its bar, so no name is cut. Times
use a log axis (`LogAxis`, ticks at 1, 2, 5 x 10^k): a fast winner stays visible
next to a candidate a thousand times slower. Shares of a whole use a linear
axis from 0 to 100%. Every function returns one `<svg>` element as text; it
scales to its container's width (`viewBox`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wpk.commands.render import format_time

WIDTH = 900            # viewBox width of every chart
LABEL_ROW = 14         # a label line
BAR_HEIGHT = 12
NOTE_GAP = 6
AXIS_HEIGHT = 22
NOTE_ROOM = 260        # room right of the longest bar for its note
LEFT = 24              # room left of the axis for its first tick label
KIND_COLORS = {"generated": "#7b3fbf", "vendor": "#3b7dd8", "library": "#e08a00",
               "fallback": "#c0392b"}
OTHER_COLOR = "#8a97a8"


@dataclass(frozen=True)
class Bar:
    """One bar: its label (the line above it), value (None: no bar, the note says why),
    color, the note right of it, whether it is the chosen one (bold, full color) and a
    tooltip."""

    label: str
    value: float | None
    color: str = OTHER_COLOR
    note: str = ""
    chosen: bool = True
    tip: str = ""


class LogAxis:
    """A log10 axis over positive values, from a 1-2-5 step below the smallest to one
    above the largest, so that the smallest bar still has a visible length."""

    def __init__(self, values: Sequence[float]):
        finite = [v for v in values if v and v > 0 and math.isfinite(v)] or [1.0]
        self.low = _step_below(min(finite) / 1.5)
        self.high = _step_above(max(finite))
        if self.high <= self.low:
            self.high = self.low * 10

    def fraction(self, value: float) -> float:
        """Where `value` sits on the axis, 0 at the low end and 1 at the high end."""
        span = math.log10(self.high) - math.log10(self.low)
        return min(1.0, max(0.0, (math.log10(value) - math.log10(self.low)) / span))

    def ticks(self) -> list[float]:
        """Tick values: decades, with 2 and 5 between them when the axis spans few decades."""
        decades = math.log10(self.high / self.low)
        steps = (1,) if decades > 3 else (1, 2, 5)
        found = []
        for power in range(math.floor(math.log10(self.low)), math.ceil(math.log10(self.high)) + 1):
            for step in steps:
                value = step * 10.0 ** power
                if self.low * 0.999 <= value <= self.high * 1.001:
                    found.append(value)
        return found


class LinearAxis:
    """A linear axis from 0 to a 1-2-5 step above `high`, ticks at about four steps."""

    def __init__(self, high: float = 1.0):
        high = high if high > 0 else 1.0
        self.step = _step_above(high / 4)
        self.low, self.high = 0.0, self.step * math.ceil(high / self.step - 1e-9)

    def fraction(self, value: float) -> float:
        """Where `value` sits on the axis, 0 at zero and 1 at the high end."""
        return min(1.0, max(0.0, value / self.high))

    def ticks(self) -> list[float]:
        """Tick values: 0 and every step up to the high end."""
        return [self.step * k for k in range(round(self.high / self.step) + 1)]


def _step_below(value: float) -> float:
    power = 10.0 ** math.floor(math.log10(value))
    return max(s * power for s in (1, 2, 5) if s * power <= value * 1.000001)


def _step_above(value: float) -> float:
    power = 10.0 ** math.floor(math.log10(value))
    return min(s * power for s in (1, 2, 5, 10) if s * power >= value * 0.999999)


def _text(x: float, y: float, content: str, **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}"{extra}>{html.escape(content)}</text>'


def _svg(height: float, body: Sequence[str], title: str) -> str:
    return (f'<svg viewBox="0 0 {WIDTH} {height:.0f}" width="100%" role="img" '
            f'xmlns="http://www.w3.org/2000/svg" class="chart">'
            f'<title>{html.escape(title)}</title>{"".join(body)}</svg>')


def _axis(axis, top: float, bottom: float, left: float, width: float,
          label: Callable[[float], str], labels_above: bool = False) -> list[str]:
    """Grid lines and tick labels of `axis` under the bars (and above them too when the
    chart is long)."""
    parts = []
    for value in axis.ticks():
        x = left + width * axis.fraction(value)
        parts.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" '
                     f'class="grid"/>')
        text = "0" if value == 0 else label(value)
        parts.append(_text(x, bottom + 14, text, text_anchor="middle", class_="tick"))
        if labels_above:
            parts.append(_text(x, top - 6, text, text_anchor="middle", class_="tick"))
    return parts


def bar_chart(bars: Sequence[Bar], *, log: bool = True, title: str = "",
              label: Callable[[float], str] = format_time) -> str:
    """Horizontal bars, one per row with its label above it, on a log axis of times (or,
    with `log=False`, a linear one from 0)."""
    values = [b.value for b in bars if b.value is not None]
    axis = LogAxis(values) if log else LinearAxis(max(values, default=1.0))
    width = WIDTH - NOTE_ROOM - LEFT
    long = len(bars) > 12
    top = AXIS_HEIGHT if long else 0.0
    parts, y = [], top
    for bar in bars:
        weight = {"font_weight": "bold"} if bar.chosen else {}
        if bar.label:  # a bar without a label belongs to the one above it
            parts.append(_text(LEFT, y + 11, bar.label, **weight))
            y += LABEL_ROW
        parts.append(_bar(bar, axis, y, width, weight))
        y += BAR_HEIGHT + (8 if bar.label else 10)
    parts = _axis(axis, top, y, LEFT, width, label, labels_above=long) + parts
    return _svg(y + AXIS_HEIGHT, parts, title)


def _bar(bar: Bar, axis, y: float, width: float, weight: dict) -> str:
    """One bar at height `y` with its note (or, without a value, the note alone)."""
    if bar.value is None:
        return _text(LEFT, y + 10, bar.note, class_="bad")
    length = max(1.0, width * axis.fraction(bar.value)) if bar.value > 0 else 0.0
    opacity = "1" if bar.chosen else "0.45"
    tip = html.escape(bar.tip or f"{bar.label}: {bar.note}")
    return (f'<rect x="{LEFT}" y="{y:.1f}" width="{length:.1f}" height="{BAR_HEIGHT}" '
            f'fill="{bar.color}" fill-opacity="{opacity}"><title>{tip}</title></rect>' +
            _text(LEFT + length + NOTE_GAP, y + 10, bar.note, **weight))


def share_chart(bars: Sequence[Bar], title: str = "") -> str:
    """Shares of a whole (0..1) as bars on a linear axis from 0 to 100%."""
    return bar_chart(bars, log=False, title=title, label=lambda v: f"{100 * v:.0f}%")


def running_best(times: Sequence[float | None]) -> list[float | None]:
    """The best (smallest) time up to each trial: never rises; None before any success."""
    best, found = None, []
    for value in times:
        if value is not None and math.isfinite(value) and (best is None or value < best):
            best = value
        found.append(best)
    return found


class CurvePlot:
    """The frame of a tuning curve: trials 1..count across, a log time axis up."""

    def __init__(self, count: int, values: Sequence[float], height: float):
        self.count, self.axis = max(1, count), LogAxis(values)
        self.left, self.right = 70.0, WIDTH - 150.0
        self.top, self.bottom = 8.0, height - AXIS_HEIGHT

    def x(self, trial: float) -> float:
        """The horizontal position of a trial (1-based)."""
        return self.left + (self.right - self.left) * (trial - 0.5) / self.count

    def y(self, value: float) -> float:
        """The vertical position of a time."""
        return self.bottom - (self.bottom - self.top) * self.axis.fraction(value)

    def hline(self, value: float, kind: str) -> str:
        """A line across the plot at a time."""
        y = self.y(value)
        return f'<line x1="{self.left}" y1="{y:.1f}" x2="{self.right}" y2="{y:.1f}" ' \
               f'class="{kind}"/>'

    def grid(self, trials: int) -> list[str]:
        """Time grid lines with their labels, and the trial numbers under the plot."""
        parts = []
        for value in self.axis.ticks():
            parts.append(self.hline(value, "grid"))
            parts.append(_text(self.left - 6, self.y(value) + 4, format_time(value),
                               text_anchor="end", class_="tick"))
        return parts + [_text(self.x(t), self.bottom + 16, str(t), text_anchor="middle",
                              class_="tick") for t in _trial_ticks(trials)]

    def trial_marks(self, times: Sequence[float | None]) -> list[str]:
        """A dot per measured trial, a red cross at the top per failed one."""
        parts = []
        for index, value in enumerate(times, start=1):
            if value is None or not math.isfinite(value):
                parts.append(_text(self.x(index), self.top + 8, "\u00d7", text_anchor="middle",
                                   class_="bad"))
            else:
                parts.append(f'<circle cx="{self.x(index):.1f}" cy="{self.y(value):.1f}" '
                             f'r="2.5" class="trial"><title>trial {index}: '
                             f'{format_time(value)}</title></circle>')
        return parts


def curve_chart(times: Sequence[float | None], reference_s: float | None = None,
                final_s: float | None = None, title: str = "", height: float = 190) -> str:
    """Best time so far vs trials (a step line, log time axis), every trial's time as a dot
    (failed trials as red marks at the top), the vendor time as a dashed line and the
    re-measured winner as a diamond after the last trial."""
    best = running_best(times)
    values = [v for v in [*times, reference_s, final_s] if v is not None and math.isfinite(v)]
    plot = CurvePlot(len(times), values, height)
    parts = plot.grid(len(times)) + plot.trial_marks(times)
    parts.append(_step_path([(plot.x(i), plot.y(v)) for i, v in enumerate(best, start=1)
                             if v is not None], plot.right))
    notes = []   # (y, text, class) right of the plot, spread so that none overlaps
    if reference_s:
        parts.append(plot.hline(reference_s, "reference"))
        notes.append((plot.y(reference_s), f"vendor {format_time(reference_s)}",
                      "reference-note"))
    if final_s:
        x, y = plot.right, plot.y(final_s)
        parts.append(f'<path d="M{x:.1f},{y - 5:.1f} l5,5 l-5,5 l-5,-5 z" class="final">'
                     f'<title>re-measured winner: {format_time(final_s)}</title></path>')
        notes.append((y, f"re-measured {format_time(final_s)}", "final-note"))
    if best and best[-1] is not None:
        notes.append((plot.y(best[-1]), f"best {format_time(best[-1])}", "best"))
    for y, text, kind in spread_labels(notes, plot.top + 4, plot.bottom):
        parts.append(_text(plot.right + 8, y + 4, text, class_=kind))
    return _svg(height, parts, title)


def spread_labels(labels: Sequence[tuple[float, str, str]], top: float, bottom: float,
                  gap: float = 13.0) -> list[tuple[float, str, str]]:
    """The labels (y, text, class) moved apart vertically, in order, so that they are at
    least `gap` apart and inside [top, bottom]."""
    placed: list[tuple[float, str, str]] = []
    for y, text, kind in sorted(labels):
        y = max(y, top, placed[-1][0] + gap if placed else top)
        placed.append((y, text, kind))
    limit = bottom
    for index in range(len(placed) - 1, -1, -1):   # then up from the bottom where needed
        y, text, kind = placed[index]
        placed[index] = (min(y, limit), text, kind)
        limit = placed[index][0] - gap
    return placed


def _step_path(points: Sequence[tuple[float, float]], right: float) -> str:
    """A step line through `points`, held flat to the right edge."""
    if not points:
        return ""
    path = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
    for (_, y_before), (x, y) in zip(points, points[1:]):
        path.append(f"H{x:.1f}")
        if y != y_before:
            path.append(f"V{y:.1f}")
    path.append(f"H{right:.1f}")
    return f'<path d="{"".join(path)}" class="curve"/>'


def _trial_ticks(count: int) -> list[int]:
    """About six trial numbers to label the x axis with."""
    if count <= 1:
        return [1] if count else []
    step = max(1, _step_above(count / 6))
    ticks = [1] + [int(t) for t in range(int(step), count + 1, int(step)) if t > 1]
    return ticks if ticks[-1] == count else ticks + [count]
