"""Tags: the listing of one state's messages that carry a tag (``list``'s ``tag``).

A message's ``tags`` are a few short words (``message.json``: at most 16,
each a letter or digit, then up to 63 of letters, digits and ``_.:=+-``).
Queued and running messages are in memory: their listing is exact.  The
others are on disk: the newest ``TAG_SCAN`` of the state are read, so a
listing of ``done`` by tag stays cheap however long ``done`` grows.
"""

from __future__ import annotations

from typing import Any

from rqsys.daemon.ledger import Ledger
from rqsys.errors import RQError
from rqsys.store import QueueStore
from rqsys.store.layout import arrival

TAG_SCAN = 2000  # messages of an ended state (newest first) searched for a tag


def tagged(msg: dict[str, Any], tag: str) -> bool:
    return tag in (msg.get("tags") or ())


def page(ledger: Ledger, store: QueueStore, state: str, tag: str, offset: int,
         limit: int) -> tuple[list[str], int]:
    """(ids carrying ``tag`` in ``state``, from ``offset``; how many there are)."""
    if state == "que":
        msgs = ledger.schedule.msgs
        found = [i for i in ledger.schedule.ordered_ids() if tagged(msgs[i], tag)]
    elif state == "run":
        found = [i for i in sorted(ledger.running, key=arrival) if tagged(ledger.running[i], tag)]
    else:
        found = [i for i in store.newest(state, 0, TAG_SCAN) if _on_disk(store, state, i, tag)]
    return found[offset:offset + limit], len(found)


def _on_disk(store: QueueStore, state: str, msg_id: str, tag: str) -> bool:
    try:
        return tagged(store.read_msg(state, msg_id), tag)
    except (RQError, OSError):
        return False  # moved on since it was listed, or unreadable
