"""Server-made SVG line charts with axes, for a queue's trends page, and how a
latency bucket is said (its bounds are powers of two: a range, not a number).

A chart is an ``<svg role="img">`` (``macros.html``'s ``chart``) titled and
described in words (latest and peak of each line), its numbers beside it in
a table a screen reader can read; counts on a linear axis from 0, latencies
on a log axis (they span milliseconds to hours).  Here its geometry is
computed; nothing runs in the browser.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

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
          latency: bool = False) -> dict[str, Any]:
    """One chart's geometry and words (``macros.html``'s ``chart``): ``lines``
    (name, one value a slot or None) from ``start``, ``step`` seconds a slot."""
    count = max((len(values) for _name, values in lines), default=0)
    known = [v for _name, values in lines for v in values if v is not None]
    scale = _LogScale(known) if latency else _LinearScale(known)
    say = bucket_range if latency else _count
    return {"ident": ident, "title": title, "width": WIDTH, "height": HEIGHT, "left": LEFT,
            "right": WIDTH - RIGHT, "bottom": HEIGHT - BOTTOM,
            "said": "; ".join(_summary(name, values, say) for name, values in lines),
            "y_ticks": [{"y": round(scale.y(value), 1), "label": label}
                        for value, label in scale.ticks()],
            "x_ticks": _x_ticks(start, step, count),
            "lines": [{"name": name, "runs": [r for r in runs if " " in r],
                       "dots": [r.split(",") for r in runs if " " not in r]}
                      for name, values in lines for runs in [_runs(values, scale, count)]],
            "rows": [{"when": _when(start + i * step, step),
                      "cells": [say(values[i]) if values[i] is not None else ""
                                 for _name, values in lines]}
                     for i in range(count)
                     if any(values[i] not in (None, 0) for _name, values in lines)]}


def _count(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _summary(name: str, values: Sequence[float | None], say: Any) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return f"{name}: none"
    return f"{name}: latest {say(known[-1])}, peak {say(max(known))}"


def _when(at: float, step: int) -> str:
    return time.strftime("%a %H:%M" if step >= 3600 else "%H:%M", time.gmtime(at))


def _x_ticks(start: float, step: int, count: int) -> list[dict[str, Any]]:
    """Time labels under the plot (UTC), at the ends and between."""
    if count < 2:
        return []
    ticks = []
    for k in range(X_TICKS):
        i = round(k * (count - 1) / (X_TICKS - 1))
        anchor = "start" if k == 0 else "end" if k == X_TICKS - 1 else "middle"
        ticks.append({"x": round(_x(i, count), 1), "anchor": anchor,
                      "label": _when(start + i * step, step)})
    return ticks


def _x(i: int, count: int) -> float:
    return LEFT + (WIDTH - LEFT - RIGHT) * (i / max(1, count - 1))


def _runs(values: Sequence[float | None], scale: _Scale, count: int) -> list[str]:
    """The polylines of a series: a gap where nothing was measured; a value
    alone between gaps is one point (``x,y``), drawn as a dot: a one-point
    line shows nothing."""
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
    return [" ".join(run) for run in runs]


class _Scale:
    top: float

    def y(self, value: float) -> float:
        raise NotImplementedError

    def ticks(self) -> list[tuple[float, str]]:
        raise NotImplementedError


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
