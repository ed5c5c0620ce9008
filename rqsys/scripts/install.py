"""Creating the special queues (relay, webhook, cleaner) where they are missing.

Each script here is an ordinary queue script speaking the pipe protocol on
fds 3/4.  :func:`install_special_queues` creates the three queues when they
are missing (a scandir entry of the same name overrides ours, like any
queue); their config runs the script with the interpreter rqsys itself runs
under (``exec_prefix``), so the venv's packages are there.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from rqsys import config
from rqsys.store import Layout

SCRIPTS_DIR = Path(__file__).resolve().parent
SPECIAL_QUEUES: dict[str, dict[str, Any]] = {
    "relay": {"num_workers": 4},
    "webhook": {"num_workers": 2},
    "cleaner": {"num_workers": 1},
}


def special_config(name: str) -> dict[str, Any]:
    """The default effective config of special queue ``name``."""
    overlay = dict(SPECIAL_QUEUES[name], exec_prefix=shlex.quote(sys.executable))
    return config.queue_config(name, str(SCRIPTS_DIR / f"{name}.py"), overlay,
                               f"built-in {name} queue")


def install_special_queues(layout: Layout) -> list[str]:
    """Create relay, webhook and cleaner where no queue of that name exists."""
    created = []
    for name in SPECIAL_QUEUES:
        if not (layout.queue_dir(name) / "config.json").exists():
            layout.create_queue_dir(name, special_config(name))
            created.append(name)
    return created
