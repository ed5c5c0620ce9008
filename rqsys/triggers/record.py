"""Each trigger's record of its fires: ``<root>/triggers/.state/<name>.json``.

::

    {"made": N, "duplicate": N, "refused": N, "last_fire": T, "last_msg_id": ID,
     "last_queue": Q, "last_error": "...", "last_error_at": T}

``made`` counts messages made, ``duplicate`` events whose delivery had made
its message already, ``refused`` events that made nothing (a bad signature,
a body too large, a missing queue, an unreadable secret...).  ``last_fire``
is the time of the last message made; ``last_error`` the last refusal's
reason (kept after later fires, with its time).  Written whole through
:func:`rqsys.store.write_file_durably` (a temp file, fsync, rename, fsync of
the directory) under a lock of this process, so the writers of one process
(the web's threads) never lose each other's counts.  The record is what
``rq triggers`` and ``/triggers.json`` show: it is not needed for a fire.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from rqsys.store import write_file_durably

STATE_DIR = ".state"  # in triggers/: a hidden name, never a trigger's
OUTCOMES = ("made", "duplicate", "refused")
ERROR_MAX = 500  # characters of last_error kept

_lock = threading.Lock()


def path_of(triggers: Path, name: str) -> Path:
    return triggers / STATE_DIR / f"{name}.json"


def read(triggers: Path, name: str) -> dict[str, Any]:
    """The trigger's record; zero counts when there is none (or it is unreadable)."""
    try:
        data = json.loads(path_of(triggers, name).read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    return {**dict.fromkeys(OUTCOMES, 0), "last_fire": None, "last_error": None, **data}


def note(triggers: Path, name: str, outcome: str, error: str = "",
         **fields: Any) -> dict[str, Any]:
    """Count one ``outcome`` (``made``: with ``last_msg_id``/``last_queue`` in
    ``fields``; ``refused``: with its ``error``) and write the record durably."""
    now = time.time()
    with _lock:
        data = read(triggers, name)
        data[outcome] = int(data.get(outcome) or 0) + 1
        if outcome == "made":
            data["last_fire"] = now
        if error:
            data.update(last_error=error[:ERROR_MAX], last_error_at=now)
        data.update(fields)
        path = path_of(triggers, name)
        path.parent.mkdir(mode=0o755, exist_ok=True)
        write_file_durably(path, json.dumps(data, sort_keys=True).encode())
    return data
