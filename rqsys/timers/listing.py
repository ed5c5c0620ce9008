"""What ``rq timers``, ``GET /timers.json`` and the Timers page show: each timer
file with its schedule, next and last run, its last message and state, and
the slots ``"overlap": "skip"`` skipped.

The last message and the skips of each timer are its record,
``<root>/timer-last/<name>.json`` (:mod:`rqsys.timers.history`), written after
each send by whoever sent it: rq-scan's background lane, or ``rqsys timer``
under systemd.  The next run is computed as the sender computes it
(:mod:`rqsys.timers.calendar`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from rqsys import config
from rqsys.errors import RQError
from rqsys.message import message_url
from rqsys.scan import scandir
from rqsys.store import Layout, QueueView
from rqsys.timers import history
from rqsys.timers.calendar import check
from rqsys.timers.periodic import Timer, load_timer, timer_name
from rqsys.wire.client import queue_for_dest

LAST_DIR = history.LAST_DIR
SLOT_STATE = "timer-slots.json"  # rq-scan's last slot of each calendar or cron timer


def record(layout: Layout, timer: Timer, slot: float, msg_id: str) -> None:
    """Remember ``msg_id`` as ``timer``'s last message (made for ``slot``)."""
    queue = queue_for_dest(timer.msg["dest"], bool(timer.msg.get("force_remote")))
    try:
        history.record(layout.root, timer.name, timer.overlap, slot, queue, msg_id)
    except OSError:
        pass  # what `rq timers` shows, and what a skip timer checks, stays a slot behind


def schedule_text(timer: Timer) -> str:
    if timer.spec is None:
        return f"every {timer.period} s"
    zone = f" ({timer.spec.timezone})" if timer.spec.timezone else ""
    return f"{timer.spec.kind} {timer.spec.expr}{zone}"


def list_timers(layout: Layout, now: float | None = None) -> list[dict[str, Any]]:
    """Every timer file (the root's timers/ first, then the .timers/ of the scandir
    ``rqsys scan`` watches)."""
    now = time.time() if now is None else now
    sysconfig = config.load_system_config(layout)
    found: dict[str, dict[str, Any]] = {}
    for tdir in (layout.timers, layout.watched_scandir() / scandir.TIMERS_SUBDIR):
        for fname in sorted(os.listdir(tdir)) if tdir.is_dir() else []:
            name = timer_name(fname)
            if name is not None and name not in found:
                found[name] = _entry(layout, sysconfig, tdir / fname, name, now)
    return [found[name] for name in sorted(found)]


def _entry(layout: Layout, sysconfig: dict[str, Any], path: Any, name: str,
           now: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "file": str(path)}
    try:
        timer = load_timer(path)
        if timer.spec is not None:
            check(timer.spec)  # as rq-scan does, which then refuses the file
    except RQError as exc:
        return dict(entry, error=str(exc))
    entry.update(schedule=schedule_text(timer), dest=timer.msg["dest"],
                 next=_next(layout, timer, now), overlap=timer.overlap)
    last = history.read(layout.root, name)
    entry.update(_last(layout, sysconfig, last))
    entry.update(_skips(last))
    return entry


def _skips(last: dict[str, Any]) -> dict[str, Any]:
    """How many slots were skipped, the latest (newest last) and the last one's slot."""
    skips = [s for s in history.skips_of(last) if isinstance(s.get("slot"), (int, float))]
    count = last.get("skipped")
    return {"skipped": count if isinstance(count, int) else 0, "skips": skips,
            "last_skipped": skips[-1].get("slot") if skips else None}


def _next(layout: Layout, timer: Timer, now: float) -> float | None:
    from rqsys.timers.slots import upcoming

    try:
        if timer.spec is None:
            last = _state(layout.timer_state).get(timer.name)
            return now if last is None else max(now, last + timer.period)
        last = _state(layout.root / SLOT_STATE).get(timer.name)
        return upcoming(timer.spec, last, now, timer.persistent)
    except RQError:
        return None  # a bad expression: rq-scan logs why


def _state(path: Any) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _last(layout: Layout, sysconfig: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The last message: when, its URL and its state now (``gone`` once pruned)."""
    try:
        queue, msg_id = str(last["queue"]), str(last["msg_id"])
    except KeyError:
        return {"last": None}
    try:
        state = QueueView(layout.queue_dir(queue)).find(msg_id)
    except (RQError, OSError):
        state = "gone"
    return {"last": last.get("at"), "last_slot": last.get("slot"), "last_msg_id": msg_id,
            "last_queue": queue,
            "last_url": message_url(sysconfig, queue, msg_id), "last_state": state}


def when(epoch: float | None) -> str:
    """A time for people: local, to the second; ``-`` for none."""
    return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S %Z",
                                                   time.localtime(epoch))


def skipped_text(t: dict[str, Any]) -> str:
    """``skipped N`` and when the last skipped slot was; ``-`` for a timer
    that never skips (overlap queue, none recorded)."""
    if t["overlap"] != history.SKIP and not t["skipped"]:
        return "-"
    last = f" (last {when(t['last_skipped'])})" if t["last_skipped"] is not None else ""
    return f"skipped {t['skipped']}{last}"


def lines(entries: list[dict[str, Any]]) -> list[str]:
    """``rq timers``: one tab-separated line each (name, schedule, next, last, URL,
    state; a timer that skips slots, or skipped some, has a 7th field: :func:`skipped_text`)."""
    out = []
    for t in entries:
        if "error" in t:
            out.append(f"{t['name']}\tREFUSED\t{t['error']}")
            continue
        fields = [t["name"], t["schedule"], when(t["next"]), when(t["last"]),
                  t.get("last_url", "-"), t.get("last_state", "-")]
        skipped = skipped_text(t)
        out.append("\t".join(fields if skipped == "-" else [*fields, skipped]))
    return out
