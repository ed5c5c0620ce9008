"""What the timer overlap tests share: a settable clock and message directories made by hand."""

from __future__ import annotations

from rqsys.store import Layout

T0 = 1_780_000_200.0  # 2026-05-28 20:30 UTC: a quarter hour
ID1, ID2 = "20260528.2030.00.000.1", "20260528.2045.00.000.2"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def put(root, state: str, msg_id: str) -> None:
    """A message directory of queue ``ov`` in ``state`` (only what the check stats)."""
    queue = Layout.from_root(root).queue_dir("ov")
    for other in ("prep", "que", "run", "err"):
        if (queue / other / msg_id).exists():
            (queue / other / msg_id).rmdir()
    (queue / state / msg_id).mkdir(parents=True)
