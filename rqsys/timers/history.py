"""Each timer's own record: its last message, and the slots ``overlap: skip`` skipped.

One small file per timer, ``<root>/timer-last/<name>.json``::

    {"slot": S, "at": T, "queue": Q, "msg_id": ID,
     "skipped": N, "skips": [{"slot", "at", "msg_id", "state"}, ...]}

written durably (:func:`rqsys.store.write_file_durably`) by whoever sent the
message (rq-scan's background lane, ``rqsys timer`` under systemd) right
after the create, and after each skip.  ``skipped`` counts every skip (the
``rqsys_timer_slots_skipped_total`` counter); ``skips`` keeps the latest
``KEPT``.  A timer with ``"overlap": "skip"`` reads it before each slot:
its last message is known across restarts, and whether it has ended is a
few stats of that message's directory (in ``prep``, ``que`` or ``run``:
not ended; in ``done``, ``err``, ``relayed`` or gone: ended), never a
walk.  The reads and writes run where the send runs, off rq-scan's loop.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rqsys import store
from rqsys.errors import RQError
from rqsys.store import Layout, QueueView

LAST_DIR = "timer-last"
QUEUE, SKIP = "queue", "skip"  # the overlap rules: "queue" (the default) makes every slot
OVERLAPS = (QUEUE, SKIP)
KEPT = 20  # skips kept in the record (``skipped`` counts them all)
# not ended: que is probed again, after run, so a message moved run -> que
# (a restart's recovery, a resend) between two stats is still seen
LIVE_PROBES = ("prep", "que", "run", "que")


@dataclass(frozen=True)
class Held:
    """A timer's previous message, not ended: why a slot makes no message.

    ``skipped`` is False when it is that very slot's message (a slot fired
    again, as after a restart between the create and the state file)."""

    queue: str
    msg_id: str
    state: str
    skipped: bool = True

    def text(self, timer: str, what: str) -> str:
        """The log line (``what``: ``slot <n>`` or ``period``)."""
        if not self.skipped:
            return (f"timer {timer}: {what} has its message {self.msg_id} in {self.queue} "
                    f"already ({self.state})")
        return (f"timer {timer}: {what} skipped (overlap skip): message {self.msg_id} "
                f"in {self.queue} is still {self.state}")


def path_of(root: Path, name: str) -> Path:
    return root / LAST_DIR / f"{name}.json"


def read(root: Path, name: str) -> dict[str, Any]:
    """A timer's record; empty when there is none (or it is unreadable)."""
    try:
        data = json.loads(path_of(root, name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(root: Path, name: str, data: dict[str, Any]) -> None:
    path = path_of(root, name)
    path.parent.mkdir(exist_ok=True)
    store.write_file_durably(path, json.dumps(data, sort_keys=True).encode())


def record(root: Path, name: str, overlap: str, slot: float, queue: str, msg_id: str) -> None:
    """``msg_id`` (in ``queue``, made for ``slot``) is timer ``name``'s last
    message; the skips so far are kept (a skip timer's count starts at 0)."""
    old = read(root, name)
    data: dict[str, Any] = {"slot": slot, "at": time.time(), "queue": queue, "msg_id": msg_id}
    for key in ("skipped", "skips"):
        if key in old:
            data[key] = old[key]
    if overlap == SKIP:
        data.setdefault("skipped", 0)
    _write(root, name, data)


def live_state(root: Path, queue: str, msg_id: str) -> str | None:
    """``prep``, ``que`` or ``run`` while the message has not ended; else None
    (ended, gone, or a record naming no message)."""
    try:
        view = QueueView(Layout.from_root(root).queue_dir(queue))
        store.check_msg_id(msg_id)
    except RQError:
        return None
    for state in LIVE_PROBES:
        if os.path.isdir(view.msg_path(state, msg_id)):
            return state
    return None


def check(root: Path, name: str, slot: float) -> Held | None:
    """Before a slot of a skip timer: its last message when that has not
    ended (then the skip is recorded, unless it is this slot's own message),
    else None: the slot makes its message."""
    last = read(root, name)
    queue, msg_id = last.get("queue"), last.get("msg_id")
    if not isinstance(queue, str) or not isinstance(msg_id, str):
        return None
    state = live_state(root, queue, msg_id)
    if state is None:
        return None
    if _same_slot(last.get("slot"), slot):
        return Held(queue, msg_id, state, skipped=False)
    held = Held(queue, msg_id, state)
    _note_skip(root, name, last, slot, held)
    return held


def _same_slot(recorded: Any, slot: float) -> bool:
    return isinstance(recorded, (int, float)) and abs(float(recorded) - slot) < 1e-3


def _note_skip(root: Path, name: str, last: dict[str, Any], slot: float, held: Held) -> None:
    skips = skips_of(last)
    skips.append({"slot": slot, "at": time.time(), "msg_id": held.msg_id, "state": held.state})
    count = last.get("skipped")
    last.update(skipped=(count if isinstance(count, int) else 0) + 1, skips=skips[-KEPT:])
    try:
        _write(root, name, last)
    except OSError:
        pass  # the slot is skipped all the same, and the log says so; only the count is short


def skips_of(last: dict[str, Any]) -> list[dict[str, Any]]:
    """The skips a record keeps, oldest first (none from a damaged one)."""
    skips = last.get("skips")
    return [s for s in skips if isinstance(s, dict)] if isinstance(skips, list) else []


def skip_counts(root: Path) -> list[tuple[str, str, int]]:
    """(timer, queue, slots skipped) of every record that counts skips (a
    skip timer's, from its first message on): ``/metrics``' counter."""
    try:
        names = sorted(os.listdir(root / LAST_DIR))  # one small file per timer
    except OSError:
        return []
    found = []
    for fname in names:
        if not fname.endswith(".json") or fname.startswith("."):
            continue
        last = read(root, fname[:-len(".json")])
        count, queue = last.get("skipped"), last.get("queue")
        if isinstance(count, int) and isinstance(queue, str):
            found.append((fname[:-len(".json")], queue, count))
    return found
