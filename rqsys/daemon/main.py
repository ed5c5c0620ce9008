"""``rqsys queue NAME``: a queue daemon's start: room for its fds, its socket, its loop."""

from __future__ import annotations

import resource

from rqsys.daemon.loop import QueueDaemon
from rqsys.run.leftovers import become_subreaper
from rqsys.store import Layout
from rqsys.systemd import listen_sockets

FD_SOFT = 8192  # rq@.service's LimitNOFILE=: 128 runs and their clients


def main(layout: Layout, name: str) -> int:
    """``rqsys queue NAME``: run one queue daemon until stopped (or idle)."""
    room_for_fds()
    become_subreaper()  # orphans of its scripts come to it: ended with their run (leftovers)
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
