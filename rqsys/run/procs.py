"""Reading the daemon's process tree in /proc: a process's stat, its children, its run's marks."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rqsys.run.cgroups import RUN_PREFIX
from rqsys.run.scopes import scope_name

MARK = b"RQ_MSG_ID="  # the run's own variable (rqsys.run.environment.RUN_KEYS)


@dataclass(frozen=True)
class Stat:
    """The part of ``/proc/<pid>/stat`` used here."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    session: int
    threads: int
    starttime: int  # with the pid, names one process: a reused pid has another


def parse_stat(data: bytes) -> Stat:
    """``/proc/<pid>/stat``'s text (its comm may hold spaces and parentheses)."""
    head, _, tail = data.rpartition(b")")
    pid, _, comm = head.partition(b" (")
    fields = tail.split()
    return Stat(int(pid), comm.decode(errors="replace"), fields[0].decode(), int(fields[1]),
                int(fields[2]), int(fields[3]), int(fields[17]), int(fields[19]))


def msg_id_of(environ: bytes) -> str | None:
    """The RQ_MSG_ID in ``/proc/<pid>/environ``'s text (None: it has none)."""
    for entry in environ.split(b"\0"):
        if entry.startswith(MARK):
            return entry[len(MARK):].decode(errors="surrogateescape")
    return None


def in_run_cgroup(cgroup: bytes, queue: str, msg_id: str) -> bool:
    """Whether ``/proc/<pid>/cgroup``'s text puts the process in the run's own
    sub-cgroup (``msg-<id>``) or scope, whose stop ends it."""
    leaves = {f"{RUN_PREFIX}{msg_id}", scope_name(queue, msg_id)}
    return any(line.split(":", 2)[-1].rstrip("/").rpartition("/")[2] in leaves
               for line in cgroup.decode(errors="replace").splitlines())


def read_proc(path: str) -> bytes | None:
    """A /proc file's whole text, or None (the process is gone, or not ours to read)."""
    try:
        with open(path, "rb", buffering=0) as file:
            return file.readall()
    except OSError:
        return None


def stat_of(pid: int) -> Stat | None:
    data = read_proc(f"/proc/{pid}/stat")
    try:
        return parse_stat(data) if data else None
    except (ValueError, IndexError):
        return None


def children_of(stat: Stat) -> list[int]:
    """The children of every thread of a process (one read when it has one thread)."""
    pid = stat.pid
    try:
        tids = [str(pid)] if stat.threads == 1 else os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        kids.extend(int(word) for word in (read_proc(f"/proc/{pid}/task/{tid}/children")
                                           or b"").split())
    return kids
