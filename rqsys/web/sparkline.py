"""Sparklines as inline SVG, made on the server (no chart library, no script)."""

from __future__ import annotations

from collections.abc import Sequence

from rqsys.web.html import e

WIDTH, HEIGHT = 90, 24


def sparkline(values: Sequence[float | None], title: str, cls: str = "") -> str:
    """A line over ``values`` (None: a gap, drawn at 0) scaled to the largest,
    with the last value's dot; ``title`` is its tooltip and accessible name."""
    points = [0.0 if v is None else float(v) for v in values]
    top = max(points, default=0.0) or 1.0
    step = WIDTH / max(1, len(points) - 1)
    coords = [(round(i * step, 1), round(HEIGHT - 2 - (v / top) * (HEIGHT - 4), 1))
              for i, v in enumerate(points)]
    line = " ".join(f"{x},{y}" for x, y in coords)
    area = f"0,{HEIGHT} {line} {WIDTH},{HEIGHT}"
    last = coords[-1] if coords else (0, HEIGHT)
    return (f'<svg class="spark {e(cls)}" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{e(title)}">'
            f"<title>{e(title)}</title>"
            f'<polygon class="area" points="{area}"/>'
            f'<polyline class="line" points="{line}"/>'
            f'<circle cx="{last[0]}" cy="{last[1]}" r="2"/></svg>')
