"""Every tunable of rqsys in one place: limits, timeouts, intervals, back-off.

Each is defined once, with why it has its value.  The two timeouts of calls
to other queue daemons can be set per unit through the environment (read when
the daemon starts), e.g. a drop-in with ``Environment=RQ_DUP_TIMEOUT=30``;
tests shorten them the same way.
"""

from __future__ import annotations

import os

from rqsys.errors import ConfigError

# ---------------------------------------------------------------- the store
# Seconds between fsyncs of the directories batched transitions touched
# (que -> run, run -> done ...): a busy queue pays one journal commit per
# interval, not per message; a crash in between may re-run a message, never
# lose one (see the durability table in recovery.py).
FLUSH_INTERVAL = 0.5

# Message directories kept ready in .tmp/ for new messages (see SpareMaker):
# enough to absorb a burst of creates while the thread makes a batch (a
# create that finds none makes its directory on the loop, and on ext4 without
# a journal then pays a syncfs there: see spares.py).
SPARE_DIRS = 32

# Spares made and synced together: the fsyncs of a batch share their writes,
# and the daemon's own fsyncs meet the spare thread's once a batch (on ext4
# without a journal a batch ends with one syncfs of the whole file system).
SPARE_BATCH = 16

# Seconds before making spares again after a failure (disk full, queue removed).
SPARE_RETRY = 1.0

# Bytes of spaces in a spare's blank msg: a message that fits is written over
# blocks the file already has, so fdatasync has only its data to write.
MSG_BLANK = 1024

# ---------------------------------------------------------------- the queue daemon
BULK_MAX = 10000  # messages in one create_many request (one group commit)
MAX_LIST = 1000  # ids in one ``list`` answer (a larger limit is cut to this)
TIMELINE_SHOWN = 200  # a message's timeline events in a ``get`` answer (status lines folded)

# Calls to other queue daemons, made off the loop (``outbound``): how long
# one may take before it is given up.
DUP_TIMEOUT = 10.0  # a script's ``dup`` to another queue; then ``fail`` on its fd 4
DUP_TIMEOUT_ENV = "RQ_DUP_TIMEOUT"
WEBHOOK_TIMEOUT = 2.0  # queueing a post_run_webhook call; then it is logged, not made
WEBHOOK_TIMEOUT_ENV = "RQ_WEBHOOK_TIMEOUT"
# A create's remote ``after`` URLs, asked in parallel: all answered within
# this, or the create is refused (Unavailable, nothing made).  Under the
# socket client's 30 s: asked one after another they took up to 64 x 10 s,
# the client heard "timed out" and its retry made the message twice.
AFTER_CHECK_DEADLINE = 20.0
# New messages made durable whose rename into que/ or prep/ failed (a full
# disk: the directory needed a new block) are tried again this often; they
# were answered ok (a client's retry would make them twice).
PLACE_RETRY = 1.0
AFTER_CHECK_DEADLINE_ENV = "RQ_AFTER_CHECK_DEADLINE"

SCRIPT_RECHECK = 5.0  # seconds between checks of a missing script (SCRIPTERROR)

# RQ_FORK_SERVER in a daemon's environment: how its scripts are started.
# "on": always by a fork server (rqsys.run.forkserver), so the loop never
# waits for an exec (in process it waits 250-450 us a start); "off": always
# in process; "auto" (the default): by the server only while messages wait
# for a worker (more are due than workers are free) in a queue of at least
# FORK_SERVER_MIN_WORKERS workers, else in process.  On a 2-core host auto
# drains 8 workers 14-42 % faster than in process (33-51 % on ext4 without
# a journal), where the exec waits hold the loop; at 2 workers the server
# measured no faster (0.85-0.96x task-spooler against 0.92-0.95x); and
# always on, it doubles the p99 from the create's answer to the script's
# first act under 64 clients, when messages start as they come, which auto
# starts in process (docs/BENCHMARKS.md).  Any other value is said when the
# daemon starts and taken as "off".
FORK_SERVER_SETTING = os.environ.get("RQ_FORK_SERVER", "auto")
FORK_SERVER_MODE = FORK_SERVER_SETTING if FORK_SERVER_SETTING in ("on", "off", "auto") else "off"
FORK_SERVER_MIN_WORKERS = 4

STATUS_INTERVAL = 0.1  # seconds between STATUS= updates (they are for people)
QUE_WINDOW = 50_000  # plain queued messages in memory; more wait in the que's tail (quetail)
READ_AHEAD = 1000  # while messages run, a start reads que/ only while fewer plain ones
                   # than this wait in memory (some 0.5 s of a drain; queload)
SNAPSHOT_MIN = 1000  # queued messages from which a clean stop leaves que.snapshot
LONGEST_WAIT = 60.0  # the loop wakes at least this often, whatever it waits for
STOP_POLL = 0.5  # while stopping, how often the loop checks the grace period

# ---------------------------------------------------------------- the embedded supervisor
# A crashed child is restarted after BACKOFF_START s, doubling up to BACKOFF_MAX;
# one that ran STABLE_AFTER s before it crashed starts again from BACKOFF_START.
BACKOFF_START, BACKOFF_MAX, STABLE_AFTER = 0.5, 30.0, 10.0
STOP_TIMEOUT = 30.0  # seconds the children get to stop on TERM before KILL


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
