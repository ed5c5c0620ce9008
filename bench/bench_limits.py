"""What per-run limits cost (issue 18): drain rate with and without them, same run.

Two queues with the same no-op script and 2 workers: ``free`` (no limits)
and ``limited`` (``message_limits``: runtime_max and memory_max), drained
alternately (gate, queue N, release), each figure the median of ROUNDS.
Here, without systemd, a limited run costs a ``setrlimit`` in the child and
a timer; with ``--systemd`` the same bench runs as root inside a booted
container (tests/helpers/nspawn.py), the ``limited`` daemon in a scope of its own
with ``Delegate=yes`` (as rq-scan's drop-in gives rq@<q>.service), so each
limited run costs what rq@<q> pays: the gate, a sub-cgroup made, the run
moved in, ``cgroup.kill``, the wait for it to empty, its accounting read
and its removal, on the ``scopes`` lane.  ``--scopes`` runs it without
delegation: a transient scope over D-Bus a run (root may make them).
``free`` must not move: a queue without limits pays nothing.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from pathlib import Path

from bench_drain import rqsys_drain
from bench_queue import Daemon, make_queue, report
from scratch import scratch_layout

from rqsys.run import scopes
from rqsys.store import Layout

N = 300
ROUNDS = 4
LIMITS = {"runtime_max": 600, "memory_max": "1G"}
HERE = Path(__file__).resolve().parent
# under systemd, the limited daemon gets a delegated cgroup, as rq@<q>.service does
DELEGATED = ("systemd-run", "--scope", "--quiet", "-p", "Delegate=yes", "--",
             "env", "RQ_CGROUP_DELEGATED=1")


def cpu_s(pid: int) -> float:
    """CPU time of a daemon and the children it reaped (its scripts, their gates)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def drain_both(layout: Layout) -> dict[str, float]:
    """Median msgs/s of each queue, drained in turn; and CPU ms a message
    (``cpu-free``, ``cpu-limited``: steady where wall time is not)."""
    make_queue(layout, "free", "echo done >&3", num_workers=2)
    make_queue(layout, "limited", "echo done >&3", num_workers=2, message_limits=LIMITS)
    delegate = scopes.available() and os.environ.get("BENCH_WAY") != "scopes"
    daemons = {"free": Daemon(layout, "free"),
               "limited": Daemon(layout, "limited", DELEGATED if delegate else ())}
    rates: dict[str, list[float]] = {name: [] for name in daemons}
    cpu = dict.fromkeys(daemons, 0.0)
    try:
        for name, daemon in daemons.items():
            rqsys_drain(daemon, layout, name, N // 4)  # warm: spares, caches, the bus
        where = Path(f"/proc/{daemons['limited'].proc.pid}/cgroup").read_text().split("\n")
        report("the limited daemon's cgroup (v2)", [w for w in where if w.startswith("0::")][0])
        for r in range(ROUNDS):  # each first in turn: a drift of the machine hits both
            for name in sorted(daemons, reverse=bool(r % 2)):
                before = cpu_s(daemons[name].proc.pid)
                rates[name].append(rqsys_drain(daemons[name], layout, name, N)["rate"])
                cpu[name] += cpu_s(daemons[name].proc.pid) - before
    finally:
        for daemon in daemons.values():
            daemon.stop()
    return {**{name: statistics.median(got) for name, got in rates.items()},
            **{f"cpu-{name}": 1000 * used / (N * ROUNDS) for name, used in cpu.items()}}


def run_here() -> int:
    scratch, layout = scratch_layout("limits-")
    try:
        rates = drain_both(layout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    how = "RLIMIT_AS set by the spawn, no systemd"
    if scopes.available():
        how = "gate + transient scope over D-Bus" if os.environ.get("BENCH_WAY") == "scopes" \
            else "gate + sub-cgroup of a delegated cgroup"
    free, limited = rates["free"], rates["limited"]
    report("drain, 2 workers, no limits", f"{free:8.0f} msgs/s")
    report(f"drain, 2 workers, message_limits ({how})",
           f"{limited:8.0f} msgs/s ({limited / free:.0%}; {1e6 / limited - 1e6 / free:.0f} us "
           "more per message)")
    report("CPU a message (daemon + its scripts), no limits", f"{rates['cpu-free']:8.2f} ms")
    report("CPU a message (daemon + its scripts), limits", f"{rates['cpu-limited']:8.2f} ms")
    return 0


def run_in_container(way: str) -> int:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from nspawn import Container, can_boot

    reason = can_boot()
    if reason:
        print(f"--systemd: {reason}")
        return 1
    box = Container()
    try:
        box.boot()
        done = box.run("env", "BENCH_DIR=/var/tmp", f"BENCH_WAY={way}", sys.executable,
                       str(Path(__file__)), check=False, timeout=600)
        print(done.stdout + done.stderr[-2000:], end="")
        return done.returncode
    finally:
        box.shutdown()


if __name__ == "__main__":
    WAYS = {"--systemd": "cgroups", "--scopes": "scopes"}
    sys.exit(run_in_container(WAYS[sys.argv[1]]) if sys.argv[1:] and sys.argv[1] in WAYS
             else run_here())
