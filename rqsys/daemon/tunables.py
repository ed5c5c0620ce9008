"""The queue daemon's tunables in one place: limits, timeouts and intervals.

The store's own (flush interval, spare directories) are in ``rqsys.store``.
The two timeouts of calls to other queue daemons can be set per unit through
the environment (read when the daemon starts), e.g. a drop-in with
``Environment=RQ_DUP_TIMEOUT=30``; tests shorten them the same way.
"""

from __future__ import annotations

import os

from rqsys.errors import ConfigError

MAX_LIST = 1000  # ids in one ``list`` answer (a larger limit is cut to this)

# Calls to other queue daemons, made off the loop (``outbound``): how long
# one may take before it is given up.
DUP_TIMEOUT = 10.0  # a script's ``dup`` to another queue; then ``fail`` on its fd 4
DUP_TIMEOUT_ENV = "RQ_DUP_TIMEOUT"
WEBHOOK_TIMEOUT = 2.0  # queueing a post_run_webhook call; then it is logged, not made
WEBHOOK_TIMEOUT_ENV = "RQ_WEBHOOK_TIMEOUT"

SCRIPT_RECHECK = 5.0  # seconds between checks of a missing script (SCRIPTERROR)
STATUS_INTERVAL = 0.1  # seconds between STATUS= updates (they are for people)
SNAPSHOT_MIN = 1000  # queued messages from which a clean stop leaves que.snapshot
LONGEST_WAIT = 60.0  # the loop wakes at least this often, whatever it waits for
STOP_POLL = 0.5  # while stopping, how often the loop checks the grace period


def seconds_from_env(var: str, default: float, environ: dict[str, str] | None = None) -> float:
    """A timeout in seconds from the environment (``default`` when unset)."""
    text = (os.environ if environ is None else environ).get(var, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"{var}={text[:40]!r}: not a number of seconds > 0")
    return value
