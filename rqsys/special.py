"""The special queues (relay, webhook, cleaner): their names, defaults and messages.

Daemons and the scripts they run both import this module, so neither depends
on the other.  Each special queue is an ordinary queue whose script is
``rqsys/scripts/<name>.py``, speaking the pipe protocol on fds 3/4.
:func:`install_special_queues` creates the three queues where they are
missing (a scandir entry of the same name overrides ours, like any queue);
their config runs the script with the interpreter rqsys itself runs under
(``exec_prefix``), so the venv's packages are there.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rqsys.store import Layout

RELAY_QUEUE = "relay"
WEBHOOK_QUEUE = "webhook"
CLEANER_QUEUE = "cleaner"

# Default settings of each special queue, overlaid on the queue defaults.  A
# relay slot is a thread of the relay worker (handed the run by the daemon),
# and a relay mostly waits (the far end, the syncs): more at once also lets
# both ends' daemons batch their syncs (twice the rate of 4 on a loaded
# machine, and 32 about 1.4 times that of 16; 48 no better than 32 against
# a far web of 16 threads).  Without a worker each slot is a Python process.
SPECIAL_QUEUES: dict[str, dict[str, Any]] = {
    RELAY_QUEUE: {"num_workers": 32},
    WEBHOOK_QUEUE: {"num_workers": 2},
    CLEANER_QUEUE: {"num_workers": 1},
}

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"


def special_config(name: str) -> dict[str, Any]:
    """The default effective config of special queue ``name``."""
    # Imported here: the names above are read by ``rq``, which must start
    # without loading the configuration schemas (jsonschema).
    from rqsys import config

    overlay = dict(SPECIAL_QUEUES[name], exec_prefix=_exec_prefix(name))
    return config.queue_config(name, str(SCRIPTS_DIR / f"{name}.py"), overlay,
                               f"built-in {name} queue")


def _exec_prefix(name: str) -> str:
    """The interpreter rqsys runs under; for relay, behind ``rqrelay`` when it was
    built: it hands each message to the relay worker when one runs."""
    python = shlex.quote(sys.executable)
    shim = Path(__file__).resolve().parent / "_native" / "rqrelay"
    if name == RELAY_QUEUE and os.access(shim, os.X_OK):
        return f"{shlex.quote(str(shim))} {python}"
    return python


def install_special_queues(layout: Layout) -> list[str]:
    """Create relay, webhook and cleaner where no queue of that name exists."""
    created = []
    for name in SPECIAL_QUEUES:
        if not (layout.queue_dir(name) / "config.json").exists():
            layout.create_queue_dir(name, special_config(name))
            created.append(name)
    return created


def webhook_message(url: str, state: str, status: str, msg: dict[str, Any]) -> dict[str, Any]:
    """The webhook-queue message announcing that ``url`` ended in ``state``."""
    payload = {"msg_id": url, "state": state, "status": status, "msg": msg}
    return {"dest": WEBHOOK_QUEUE, "src": url, "param1": url, "param2": state,
            "param3": json.dumps(payload)}
