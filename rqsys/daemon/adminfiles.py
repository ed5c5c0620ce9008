"""RQ's admin files of one queue: ``config/<q>.down`` and ``config/<q>.pause``
under the root, read at start and on each status request, watched with inotify.

While the watch holds, a create does not stat them: the loop takes the
watch's events before the requests of the same wait (``QueueDaemon._turn``),
so a request sent after an operator's ``touch`` already sees it.  A watch
that ends (the directory removed or moved) leaves ``watching`` False, and
each create reads the files again.

RQ keeps a queue's admin state in these two files (``rq adminoper`` creates
and removes them; an operator may ``touch`` them): ``.down`` makes the queue
DOWN, else ``.pause`` makes it PAUSE.  rqsys keeps its own durable admin
state too (``rq adminoper down|pause``, the store's ``admin_state``); the
queue's state is the stricter of the two (``QueueContext.admin``), and
``rq adminoper up`` / ``resume`` also remove ``.down`` / ``.pause`` as RQ's do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyinotify  # type: ignore[import-untyped]

from rqsys.store.durable import fsync_dirs

MASK = (pyinotify.IN_CREATE | pyinotify.IN_DELETE | pyinotify.IN_MOVED_FROM
        | pyinotify.IN_MOVED_TO | pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF)
STRICTNESS = ("UP", "PAUSE", "DOWN")
_RANK = {state: rank for rank, state in enumerate(STRICTNESS)}


def stricter(a: str, b: str) -> str:
    """The stricter of two admin states (DOWN over PAUSE over UP)."""
    return a if _RANK[a] >= _RANK[b] else b


class AdminFiles:
    """The ``.down`` and ``.pause`` files of one queue, and their watch."""

    def __init__(self, config_dir: Path, name: str) -> None:
        self.config_dir = config_dir
        self.down = config_dir / f"{name}.down"
        self.pause = config_dir / f"{name}.pause"
        self._down, self._pause = str(self.down), str(self.pause)
        self._wm: Any = None
        self._notifier: Any = None
        self.fd = -1  # the inotify fd in the loop's selector, -1 when not watching
        self.watching = False  # the watch holds: the state is known without a stat

    def state(self) -> str:
        """DOWN when ``.down`` exists, else PAUSE when ``.pause`` does, else UP
        (plain string paths, no Path objects made)."""
        if os.path.exists(self._down):
            return "DOWN"
        return "PAUSE" if os.path.exists(self._pause) else "UP"

    def remove_for(self, oper: str) -> None:
        """``up`` removes ``.down``, ``resume`` removes ``.pause`` (RQ's adminoper),
        durably: called on the background sync lane."""
        doomed = {"up": self.down, "resume": self.pause}.get(oper)
        if doomed is None or not doomed.exists():
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(doomed)
        fsync_dirs([self.config_dir])

    # ------------------------------------------------------------ the watch
    def watch(self, selector: selectors.BaseSelector, changed: Callable[[], None]) -> bool:
        """Watch the config directory in ``selector``; ``changed`` runs after any
        change there.  False when there is no such directory (nothing to watch:
        the state is still read at every status request)."""
        if not self.config_dir.is_dir():
            return False
        pyinotify.log.setLevel(logging.CRITICAL)  # it logs, we report
        self._wm = pyinotify.WatchManager()
        self._notifier = pyinotify.Notifier(self._wm, default_proc_fun=self._seen)
        wd = self._wm.add_watch(str(self.config_dir), MASK, quiet=True).get(str(self.config_dir))
        if wd is None or wd < 0:
            self.close()
            return False

        def on_ready(_key: Any, _mask: int) -> None:
            self._notifier.read_events()
            self._notifier.process_events()
            changed()

        self.fd = self._wm.get_fd()
        selector.register(self.fd, selectors.EVENT_READ, on_ready)
        self.watching = True
        return True

    def _seen(self, event: Any) -> None:
        """One inotify event: the watch ends with its directory (or a lost event)."""
        if event.mask & (pyinotify.IN_IGNORED | pyinotify.IN_Q_OVERFLOW
                         | pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF):
            self.watching = False

    def close(self, selector: selectors.BaseSelector | None = None) -> None:
        if self._wm is None:
            return
        if selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(self._wm.get_fd())
        self._wm.close()
        self._wm = self._notifier = None
        self.fd, self.watching = -1, False
