"""Sparklines as inline SVG, made on the server (no chart library, no script):
their geometry here, their markup in ``templates/macros.html``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

WIDTH, HEIGHT = 90, 24


def sparkline(values: Sequence[float | None], title: str, cls: str = "",
              said: str = "") -> dict[str, Any]:
    """A line over ``values`` (None: a gap, drawn at 0) scaled to the largest,
    with the last value's dot; ``title`` is its tooltip and accessible name,
    ``said`` the figure printed beside it."""
    points = [0.0 if v is None else float(v) for v in values]
    top = max(points, default=0.0) or 1.0
    step = WIDTH / max(1, len(points) - 1)
    coords = [(round(i * step, 1), round(HEIGHT - 2 - (v / top) * (HEIGHT - 4), 1))
              for i, v in enumerate(points)]
    line = " ".join(f"{x},{y}" for x, y in coords)
    return {"width": WIDTH, "height": HEIGHT, "cls": cls, "title": title, "said": said,
            "line": line, "area": f"0,{HEIGHT} {line} {WIDTH},{HEIGHT}",
            "dot": coords[-1] if coords else (0, HEIGHT)}
