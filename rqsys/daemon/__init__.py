"""The queue daemon: one process per queue, the sole writer of its directory.

Its rooms, each a module:

* ``loop``        the event loop in fixed phases; start-up, idle, stop, reload, STATUS=
* ``server``      the listening socket, connections, framing, dispatch over the op table
* ``schema``      the JSON Schema of every request, checked before any handler runs
* ``ops``         the table of operations, and the handlers of the simple ones
* ``intake``      create, clone, a local dup, attachments, the group commit
* ``runner``      starting scripts, their environment, status lines, dups, exits
* ``transitions`` the only place a message changes state; it owns the counts
* ``children``    the scripts' status pipes and pidfds, read in one batch a turn
* ``outbound``    anything that talks to another queue daemon: dups, webhooks (off the loop)
* ``context``     what every room reads of the queue: name, config, admin state
* ``adminfiles``  RQ's admin files config/<q>.down|.pause, watched with inotify

Slow work runs on background threads (``rqsys.background``): attachments are
hashed on one lane, the fsyncs an answer waits for on another, each peer
daemon is called on a lane of its own; spare message directories are made
on the store's thread.  The loop itself never waits on any of them, nor on
another process.  A clean stop with many queued messages leaves
``que.snapshot`` for a fast next start (see ``rqsys.store``).
"""

from __future__ import annotations

import resource

from rqsys.daemon.loop import QueueDaemon
from rqsys.store import Layout
from rqsys.systemd import listen_sockets

__all__ = ["QueueDaemon", "main"]
FD_SOFT = 8192  # rq@.service's LimitNOFILE=: 128 runs and their clients


def main(layout: Layout, name: str) -> int:
    """``rqsys queue NAME``: run one queue daemon until stopped (or idle)."""
    room_for_fds()
    sockets = listen_sockets()
    listener = next(iter(sockets.values()), None)
    return QueueDaemon(layout, name, listener).run()


def room_for_fds() -> None:
    """Raise the soft RLIMIT_NOFILE to FD_SOFT, within the hard limit.

    A run holds six to eight fds (its pipes and the script's ends of them,
    its pidfd and timeline; under journald its output's), so 128 workers
    need more than the soft 1024 most shells and units start with; the loop
    uses epoll, never select(), so a high number costs nothing.  Scripts
    inherit it, as they inherit rq@.service's ``LimitNOFILE=8192``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_SOFT if hard == resource.RLIM_INFINITY else min(FD_SOFT, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
