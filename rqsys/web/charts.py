"""Server-made SVG line charts with axes, for a queue's trends page, and how a
latency bucket is said (its bounds are powers of two: a range, not a number).

A chart is an ``<svg role="img">`` titled and described in words (latest and
peak of each line), its numbers beside it in a table a screen reader can
read; counts on a linear axis from 0, latencies on a log axis (they span
milliseconds to hours).  Nothing runs in the browser.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from rqsys.web.html import e

WIDTH, HEIGHT = 720, 230
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 14, 34
X_TICKS = 6
Series = tuple[str, Sequence[float | None]]


def duration(seconds: float) -> str:
    """A duration as people say it: 250 ms, 2 s, 1.5 min, 3 h."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def bucket_range(upper: float | None) -> str:
    """A percentile as the bucket it fell in: ``1–2 s`` (the stats keep
    histograms whose buckets double from 1 ms: the upper bound alone reads
    as exact when it is not)."""
    if upper is None:
        return "none"
    if upper <= 0.001:
        return "≤ 1 ms"
    return f"{duration(upper / 2)}–{duration(upper)}"


def chart(ident: str, title: str, start: float, step: int, lines: list[Series],
          latency: bool = False) -> str:
    """One chart: ``lines`` (name, one value a slot or None) from ``start``,
    ``step`` seconds a slot."""
    count = max((len(values) for _name, values in lines), default=0)
    known = [v for _name, values in lines for v in values if v is not None]
    scale = _LogScale(known) if latency else _LinearScale(known)
    said = "; ".join(_summary(name, values, latency) for name, values in lines)
    parts = [f'<svg class="chart" id="{e(ident)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-labelledby="{e(ident)}-t {e(ident)}-d">'
             f'<title id="{e(ident)}-t">{e(title)}</title><desc id="{e(ident)}-d">{e(said)}</desc>']
    parts += scale.axis(latency)
    parts += _x_axis(start, step, count)
    for n, (_name, values) in enumerate(lines):
        parts += [f'<polyline class="s{n}" points="{points}"/>'
                  for points in _runs(values, scale, count)]
    legend = "".join(f'<span class="k{n}">━ {e(name)}</span>' for n, (name, _v) in enumerate(lines))
    return (f'<figure class="chart"><figcaption><strong>{e(title)}</strong> '
            f'<span class="legend">{legend}</span></figcaption>{"".join(parts)}</svg>'
            f"{_numbers(ident, start, step, lines, latency)}</figure>")


def _summary(name: str, values: Sequence[float | None], latency: bool) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return f"{name}: none"
    say = bucket_range if latency else (lambda v: f"{v:g}")
    return f"{name}: latest {say(known[-1])}, peak {say(max(known))}"


def _numbers(ident: str, start: float, step: int, lines: list[Series], latency: bool) -> str:
    """The chart's numbers, folded away (for a screen reader, or to copy)."""
    say = bucket_range if latency else (lambda v: "" if v is None else f"{v:g}")
    count = max((len(values) for _name, values in lines), default=0)
    head = "".join(f"<th>{e(name)}</th>" for name, _values in lines)
    rows = "".join(
        f"<tr><td>{e(_when(start + i * step, step))}</td>"
        + "".join(f"<td>{e(say(values[i]) if values[i] is not None else '')}</td>"
                  for _name, values in lines) + "</tr>"
        for i in range(count) if any(values[i] is not None and values[i] != 0
                                     for _name, values in lines))
    return (f'<details><summary>the numbers</summary><div class="scroll"><table '
            f'id="{e(ident)}-numbers"><thead><tr><th>from (UTC)</th>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div></details>")


def _when(at: float, step: int) -> str:
    return time.strftime("%a %H:%M" if step >= 3600 else "%H:%M", time.gmtime(at))


def _x_axis(start: float, step: int, count: int) -> list[str]:
    """Time labels under the plot (UTC), at the ends and between."""
    if count < 2:
        return []
    parts = [f'<line class="grid" x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
             f'y2="{HEIGHT - BOTTOM}"/>']
    for k in range(X_TICKS):
        i = round(k * (count - 1) / (X_TICKS - 1))
        x = _x(i, count)
        anchor = "start" if k == 0 else "end" if k == X_TICKS - 1 else "middle"
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="{anchor}">'
                     f"{e(_when(start + i * step, step))}</text>")
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 4}" text-anchor="end">UTC</text>')
    return parts


def _x(i: int, count: int) -> float:
    return LEFT + (WIDTH - LEFT - RIGHT) * (i / max(1, count - 1))


def _runs(values: Sequence[float | None], scale: _Scale, count: int) -> list[str]:
    """The polylines of a series: a gap where nothing was measured."""
    runs: list[list[str]] = []
    current: list[str] = []
    for i, value in enumerate(values):
        if value is None:
            if current:
                runs.append(current)
            current = []
            continue
        current.append(f"{_x(i, count):.1f},{scale.y(value):.1f}")
    if current:
        runs.append(current)
    return [" ".join(run * (2 if len(run) == 1 else 1)) for run in runs]


class _Scale:
    top: float

    def y(self, value: float) -> float:
        raise NotImplementedError

    def ticks(self) -> list[tuple[float, str]]:
        raise NotImplementedError

    def axis(self, latency: bool) -> list[str]:
        parts = []
        for value, label in self.ticks():
            y = self.y(value)
            parts.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" '
                         f'y2="{y:.1f}"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                         f'text-anchor="end">{e(label)}</text>')
        return parts


class _LinearScale(_Scale):
    """0 to a round number above the largest value."""

    def __init__(self, known: list[float]) -> None:
        peak = max(known, default=0) or 1
        magnitude = 10 ** math.floor(math.log10(peak))
        self.unit = next(m * magnitude for m in (0.2, 0.5, 1, 2, 5, 10)
                         if peak / (m * magnitude) <= 5)
        self.top = self.unit * math.ceil(peak / self.unit)

    def y(self, value: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - value / self.top)

    def ticks(self) -> list[tuple[float, str]]:
        steps = round(self.top / self.unit)
        return [(k * self.unit, f"{k * self.unit:g}") for k in range(steps + 1)]


class _LogScale(_Scale):
    """Powers of ten of seconds, around what was measured."""

    def __init__(self, known: list[float]) -> None:
        positive = [v for v in known if v > 0] or [0.001, 1.0]
        self.low = 10 ** math.floor(math.log10(min(positive)))
        self.top = 10 ** math.ceil(math.log10(max(positive)) + 1e-9)
        if self.top <= self.low:
            self.top = self.low * 10

    def y(self, value: float) -> float:
        span = math.log10(self.top) - math.log10(self.low)
        share = (math.log10(max(value, self.low)) - math.log10(self.low)) / span
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - share)

    def ticks(self) -> list[tuple[float, str]]:
        out, value = [], self.low
        while value <= self.top * 1.0001:
            out.append((value, duration(value)))
            value *= 10
        return out
