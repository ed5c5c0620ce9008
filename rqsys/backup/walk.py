"""Where each message of a live root is: states walked as messages move, moved ones sought.

Messages move forward, ``.tmp/`` (written, acknowledged, not yet renamed
into place) -> ``prep`` -> ``que`` -> ``run`` -> ``done``, ``err`` or
``relayed``, so a walk in that order meets a message that moves meanwhile
again further on.  Two moves go back: a resend, a stop or a failed start
(``run`` -> ``que``) and a retry (``err`` -> ``que``); a message moved back
after ``que/`` was walked and before its old state was would be missed.
So the walk runs under a watch (``watch.py``) of the states every move
touches, and each message seen moving is looked for again (:func:`locate`)
when it is copied.  A message seen twice keeps the later sighting.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rqsys.backup.watch import Moves, Overflow
from rqsys.errors import StoreError
from rqsys.store.layout import MSG_ID_RE, QUEUE_NAME_RE, SPARE_PREFIX, TMP_DIR
from rqsys.store.view import QueueView, listdir

ORDER = ("prep", "que", "run", "err", "done", "relayed")  # the walk: the way messages move
LOOKS, LOOK_PAUSE = 5, 0.002  # a message moving as it is looked for is looked for again
WALKS = 3  # walks started over after the kernel dropped events
Key = tuple[str, str]  # (queue, message id)


@dataclass(frozen=True)
class Place:
    """Where a message was seen: its state, and its directory (in ``.tmp/`` for
    one written and acknowledged but not yet renamed into its state)."""

    state: str
    path: Path


def queues(root: Path) -> list[str]:
    """Every queue directory of the root (in service or not)."""
    base = root / "queue"
    return sorted(n for n in listdir(base) if QUEUE_NAME_RE.match(n) and (base / n).is_dir())


def find_all(root: Path) -> tuple[dict[Key, Place | None], int]:
    """Every message of the root: its place, or None for one seen moving
    (looked for when it is copied); and how many were seen moving."""
    for _walk in range(WALKS):
        try:
            return _walk_watched(root)
        except Overflow:
            continue
    raise StoreError(f"messages moved faster than inotify reported them, {WALKS} walks over: "
                     "raise fs.inotify.max_queued_events")


def _walk_watched(root: Path) -> tuple[dict[Key, Place | None], int]:
    names = queues(root)
    with Moves() as moves:
        for name in names:
            moves.watch(name, root / "queue" / name)
        found: dict[Key, Place | None] = {}
        for name in names:
            _walk_queue(QueueView(root / "queue" / name), found, moves)
        moves.drain()
        moved = {key for key in moves.moved if MSG_ID_RE.match(key[1])}
    for key in moved:
        found[key] = None
    return found, len(moved)


def _walk_queue(view: QueueView, found: dict[Key, Place | None], moves: Moves) -> None:
    for msg_id, place in _unplaced(view):
        found[(view.name, msg_id)] = place
    for state in ORDER:
        for msg_id in view.ids(state):
            found[(view.name, msg_id)] = Place(state, view.msg_dir(state, msg_id))
        moves.drain()


def _unplaced(view: QueueView) -> list[tuple[str, Place]]:
    """Messages written whole in ``.tmp/`` but not renamed into place (recovery
    would place them: ``<id>.<state>`` or a filled spare, for que)."""
    tmp = view.qdir / TMP_DIR
    found = []
    for name in listdir(tmp):
        base, _, state = name.rpartition(".")
        if name.startswith(SPARE_PREFIX):
            state = "que"
        elif state not in ("que", "prep") or not MSG_ID_RE.match(base):
            continue
        msg_id = _msg_id(tmp / name / "msg")
        if msg_id:
            found.append((msg_id, Place(state, tmp / name)))
    return found


def _msg_id(path: Path) -> str:
    try:
        msg = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return ""  # not written whole: never acknowledged
    msg_id = msg.get("msg_id") if isinstance(msg, dict) else None
    return msg_id if isinstance(msg_id, str) and MSG_ID_RE.match(msg_id) else ""


def locate(view: QueueView, msg_id: str) -> Place | None:
    """Where a message is now; None when it is in no state (deleted, pruned,
    its queue trashed).  One moving between two looks is looked for again."""
    for look in range(LOOKS):
        for state in ORDER:
            path = view.msg_dir(state, msg_id)
            if path.is_dir():
                return Place(state, path)
        if look < LOOKS - 1:
            time.sleep(LOOK_PAUSE)
    return None


def still_there(place: Place) -> bool:
    """Whether a message's directory is where it was copied from."""
    return os.path.isdir(place.path)

