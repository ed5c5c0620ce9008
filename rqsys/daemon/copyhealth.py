"""The health of the daemon's copies of its store: the messages' timelines and
the search index.  Their writes never fail a message (the store is the truth),
so a write that fails is counted where it happens; this module shows the
counts in ``stats`` and tells the log when they change (once per change, not
per failure: a full disk fails every line)."""

from __future__ import annotations

from typing import Any

from rqsys.observe.events import EventLog
from rqsys.observe.timeline import Timeline
from rqsys.search.index import SearchIndex
from rqsys.store.room import Room


class CopyHealth:
    """The timelines' and the search index's failed writes, for ``stats`` and the log."""

    def __init__(self, timeline: Timeline, index: SearchIndex, log: EventLog,
                 room: Room) -> None:
        self.timeline, self.index, self.log, self.room = timeline, index, log, room
        self._told = {"timelines": 0, "index": 0}  # failures already in the log
        self._behind = False  # the index was told to be behind

    def report(self) -> dict[str, Any]:
        """The ``stats`` fields: failed writes since the daemon started, the last reason."""
        return {"timelines": {"failed": self.timeline.failed, "error": self.timeline.error},
                "index": {"failed": self.index.failed, "error": self.index.error,
                          "behind": self.index.behind}}

    def tell(self) -> None:
        """Log what changed since the last call (the loop calls it as each turn
        ends, before the log's flush: a few comparisons).  Not while the file
        system is full: its own line says so, and the first turn with room again
        tells what failed meanwhile, once.  A new failure reads the file system
        first: it may have filled since the last reading."""
        if self._rose():
            self.room.doubt()
            self.room.check()
        if self.room.full:
            return
        failed = self.timeline.failed
        if failed > self._told["timelines"]:
            self._told["timelines"] = failed
            self.log.event("warning", f"timelines: {failed} lines not written since the start"
                           f" (the last: {self.timeline.error}); the messages are unharmed")
        failed, behind = self.index.failed, self.index.behind
        if failed > self._told["index"]:
            self._told["index"] = failed
            mending = "; searches answer partial until it is mended" if behind else ""
            self.log.event("warning", f"search index: {failed} writes failed since the start"
                           f" (the last: {self.index.error}){mending}")
        if self._behind and not behind:
            self.log.event("daemon", "search index mended: searches are whole again")
        self._behind = behind

    def _rose(self) -> bool:
        return (self.timeline.failed > self._told["timelines"]
                or self.index.failed > self._told["index"])
