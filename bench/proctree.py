"""CPU time of process trees from ``/proc``, in total and by role (a steady figure under load).

A role is named from a process's command line: ``serve`` (the supervisor),
``web``, ``scan``, ``relayworker``, ``queue <name>``; each is given its own
CPU and, apart, that of its ended children it reaped (``cutime`` +
``cstime``: a queue daemon's scripts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Proc:
    pid: int
    ppid: int
    own: int  # ticks: utime + stime
    reaped: int  # ticks: cutime + cstime


def processes() -> dict[int, Proc]:
    procs = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(name)
        procs[pid] = Proc(pid, int(fields[1]), int(fields[11]) + int(fields[12]),
                          int(fields[13]) + int(fields[14]))
    return procs


def descendants(procs: dict[int, Proc], roots: set[int]) -> dict[int, int]:
    """pid -> its root, for every process under one of ``roots`` (roots included)."""
    under = {}
    for pid in procs:
        walk = pid
        while walk > 1 and walk not in roots:
            walk = procs[walk].ppid if walk in procs else 0
        if walk in roots:
            under[pid] = walk
    return under


def tree_cpu(roots: set[int]) -> float:
    """CPU seconds of ``roots`` and all their descendants (ended ones too)."""
    procs = processes()
    return sum(procs[p].own + procs[p].reaped for p in descendants(procs, roots)) / TICK


def role(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    for word in ("serve", "web", "scan"):
        if word in argv:
            return word
    if "queue" in argv:
        return "queue " + argv[argv.index("queue") + 1]
    if any(w.endswith("relayworker") for w in argv):
        return "relayworker"
    return os.path.basename(argv[0]) if argv else "?"


def by_role(roots: dict[int, str]) -> dict[str, tuple[int, int]]:
    """'<host> <role>' -> (own ticks, reaped children's ticks), ``roots`` mapping
    each tree's root pid to its host's name.  Processes that share a label add up."""
    procs = processes()
    out: dict[str, tuple[int, int]] = {}
    for pid, root in descendants(procs, set(roots)).items():
        label = f"{roots[root]} {role(pid)}"
        own, reaped = out.get(label, (0, 0))
        out[label] = (own + procs[pid].own, reaped + procs[pid].reaped)
    return out


def role_deltas(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                count: int) -> list[tuple[str, float, float]]:
    """(label, ms of own CPU per message, ms of its reaped children's), largest first."""
    rows = []
    for label, (own, reaped) in after.items():
        own0, reaped0 = before.get(label, (0, 0))
        rows.append((label, (own - own0) * 1000 / TICK / count,
                     (reaped - reaped0) * 1000 / TICK / count))
    return sorted(rows, key=lambda r: -(r[1] + r[2]))
