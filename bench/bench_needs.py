"""Admission by need (issue 34): what slots, needs and a budget cost, each
beside the plain queue measured in the same run.

1. The scheduler alone, in process (``rqsys.daemon.scheduler.Schedule`` with
   its ``Room`` and ``Gate``): SCHED_N messages added, then the loop's turns
   replayed (``next_due``, ``pop_ready`` while a slot is free, ``started``;
   then the oldest running one ``ended``), 8 workers: WARM starts untimed
   (the first pop moves every message to the ready heap), PHASE starts
   timed, the clock moved on by ``reserve_after`` (60 s), RESERVED more timed:
   once a need has waited that long the que is reserved for it.  The clock
   moves 3 ms a turn (about a drain's pace).  (a) no budget, plain
   messages: what every existing queue pays; (b) a budget (memory 16G, cpus
   8, gpus 0-3) and mixed needs (memory 1-4G, cpus 0.5-2, gpus 0-2, slots
   1-2: 96 distinct needs); (c) the same budget, plain messages.
   Microseconds a start, the median and min of REPEATS, the cases
   alternating.
2. A real queue daemon drained (gate, queue N with ``create_many``, release,
   until the last has ended; ``echo done >&3``): (a) num_workers 8; (b) the
   same with a budget (memory 16G, cpus 8, gpus 0-3) and messages of mixed
   needs (memory 1-4G, cpus 0.5-2, gpus 0-2, slots 1).  Messages/s and the
   daemon's CPU per message (steady where a shared machine's rates are not).
   (b) also pays what a run with limits pays: its memory need is its
   RLIMIT_AS in embedded mode (no spare hands it off: ``Runner._start``),
   and fewer run at once when the budget, not the slots, is what is full.

``--quick``: smaller counts, for a smoke run.  ``BENCH_DIR=<dir>``: where the
scratch root goes (``scratch.py``).
"""

from __future__ import annotations

import collections
import random
import shutil
import statistics
import sys
import time
from typing import Any

from bench_drain import _index_settled, cpu_seconds
from bench_queue import Daemon, make_queue, report
from scratch import scratch_layout

from rqsys.daemon.gates import Gate
from rqsys.daemon.room import Room
from rqsys.daemon.scheduler import Schedule
from rqsys.run import scopes
from rqsys.store import IdMaker, Layout
from rqsys.wire.client import QueueClient

QUICK = "--quick" in sys.argv[1:]
SCHED_N = 20_000 if QUICK else 100_000
WARM = 1_000  # starts untimed first
PHASE = 2_000 if QUICK else 10_000  # starts timed before reserve_after has passed
RESERVED = 500 if QUICK else 2_000  # and after (each costs a few ms: make bench's 10 minutes)
REPEATS = 3
WORKERS = 8
STEP = 0.003  # simulated seconds a loop turn (about a drain's pace)
RESERVE_AFTER = 60.0  # the queue's default
DRAIN_N = 2_000 if QUICK else 10_000
ROUNDS = 2  # each queue first once (3 rounds of 10,000 would pass make bench's 10 minutes)
WARM_N = 200
CHUNK = 2_000  # messages a create_many
CALL_TIMEOUT = 300.0
DRAIN_TIMEOUT = 600.0
SCRIPT = "echo done >&3"
BUDGET = {"memory": "16G", "cpus": 8, "gpus": ["0", "1", "2", "3"]}
PLAIN = {"num_workers": WORKERS}
BUDGETED = {"num_workers": WORKERS, "budget": BUDGET}
Msg = dict[str, Any]


# ----------------------------------------------------------------- messages
def plain_msgs(n: int) -> list[Msg]:
    return [{"param1": str(i)} for i in range(n)]


def needs_msgs(n: int, max_slots: int, seed: int = 34) -> list[Msg]:
    """Messages of mixed needs (memory 1-4G, cpus 0.5-2, gpus 0-2, slots 1-max_slots)."""
    pick = random.Random(seed)
    msgs = []
    for i in range(n):
        needs: dict[str, Any] = {"memory": f"{pick.randint(1, 4)}G",
                                 "cpus": pick.choice((0.5, 1, 1.5, 2))}
        gpus = pick.randint(0, 2)
        if gpus:
            needs["gpus"] = gpus
        msgs.append({"param1": str(i), "slots": pick.randint(1, max_slots), "needs": needs})
    return msgs


# ----------------------------------------------------------------- the scheduler alone
def schedule_of(config: dict[str, Any]) -> Schedule:
    """A queue's schedule as its loop makes it (``rqsys.daemon.loop``)."""
    return Schedule([], [], Gate.from_config({}), Room(config), RESERVE_AFTER)


class Replay:
    """The loop's turns on one schedule: ``next_due``; ``pop_ready`` and
    ``started`` while a slot is free; the oldest running one ``ended``."""

    def __init__(self, config: dict[str, Any], ids: list[str], msgs: list[Msg]) -> None:
        self.schedule = schedule_of(config)
        started = time.perf_counter()
        for msg_id, msg in zip(ids, msgs, strict=True):
            self.schedule.add(msg_id, msg)
        self.add_us = (time.perf_counter() - started) / len(msgs) * 1e6
        self.running: collections.deque[tuple[str, Msg]] = collections.deque()
        self.now, self.busy, self.starts = time.time(), 0, 0

    def turns(self, starts: int) -> float:
        """Microseconds a start over the next ``starts`` starts."""
        schedule, running, goal = self.schedule, self.running, self.starts + starts
        began = time.perf_counter()
        while self.starts < goal:
            schedule.next_due()
            while schedule.room.has_free_slot() and (picked := schedule.pop_ready(self.now)):
                schedule.started(*picked, self.now)
                running.append(picked)
                self.starts, self.busy = self.starts + 1, self.busy + len(running)
            if not running:
                raise RuntimeError(f"nothing started with {len(schedule)} queued")
            schedule.ended(*running.popleft())
            self.now += STEP
        return (time.perf_counter() - began) / starts * 1e6


def replay(config: dict[str, Any], ids: list[str], msgs: list[Msg]) -> dict[str, float]:
    """Every message added; WARM starts (the first pop moves all to the ready
    heap), then PHASE starts before ``reserve_after`` has passed for any,
    and RESERVED after it has (a need waiting that long reserves the que)."""
    run = Replay(config, ids, msgs)
    run.turns(WARM)
    before = run.turns(PHASE)
    run.now += RESERVE_AFTER
    after = run.turns(RESERVED)
    return {"add": run.add_us, "start": before, "reserved": after,
            "running": run.busy / run.starts}


CASES = {"a": "no budget, plain msgs (baseline)", "b": "budget, mixed needs, slots 1-2",
         "c": "budget, plain msgs"}


def bench_schedule() -> None:
    maker = IdMaker(lambda: 1.8e9)  # one millisecond: ids in order by their counter
    ids = [maker.next_id() for _ in range(SCHED_N)]
    cases = {"a": (PLAIN, plain_msgs(SCHED_N)), "b": (BUDGETED, needs_msgs(SCHED_N, 2)),
             "c": (BUDGETED, plain_msgs(SCHED_N))}
    got: dict[str, list[dict[str, float]]] = {key: [] for key in cases}
    for r in range(REPEATS):
        for key in sorted(cases, reverse=bool(r % 2)):  # alternate: drift hits all
            got[key].append(replay(cases[key][0], ids, cases[key][1]))
    print(f"Schedule: {SCHED_N:,} added, {WORKERS} workers, then {WARM:,} starts, "
          f"{PHASE:,} timed, {RESERVE_AFTER:g} s on, {RESERVED:,} timed (reserved)", flush=True)
    for key, runs in got.items():
        report(f"Schedule {key}: {CASES[key]}", f"{_us(runs, 'start', 7)} a start, "
               f"{_us(runs, 'reserved', 0)} reserved; add {_median(runs, 'add'):.1f} us; "
               f"{_median(runs, 'running'):.1f} running")
    for key in ("b", "c"):
        report(f"Schedule {key} vs a", " ".join(
            f"{_median(got[key], k) / _median(got['a'], k):7.2f}x {what}"
            for k, what in (("start", "a start,"), ("reserved", "reserved"))))


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def _us(runs: list[dict[str, float]], key: str, width: int) -> str:
    return f"{_median(runs, key):{width}.1f} us (min {min(run[key] for run in runs):.1f})"


# ----------------------------------------------------------------- a daemon's drain
def drain(daemon: Daemon, layout: Layout, name: str, msgs: list[Msg]) -> tuple[float, float]:
    """Gate (pause), queue ``msgs``, release: (msgs/s, daemon CPU us a message)."""
    pid = daemon.proc.pid
    with QueueClient(layout, name, timeout=CALL_TIMEOUT) as client:
        client.call("adminoper", oper="pause")
        before = client.call("counts")["counts"]
        for at in range(0, len(msgs), CHUNK):
            results = client.call("create_many", msgs=msgs[at:at + CHUNK])["results"]
            refused = [r for r in results if "error" in r]
            if refused:
                raise RuntimeError(f"{name}: {len(refused)} refused, first: {refused[0]}")
        _index_settled(pid)  # the creates' index rows are not the drain's cost
        cpu0, started = cpu_seconds(pid), time.perf_counter()
        client.call("adminoper", oper="up")
        _wait_ended(client, name, before, len(msgs))
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu0
    return len(msgs) / elapsed, cpu / len(msgs) * 1e6


def _wait_ended(client: QueueClient, name: str, before: dict[str, int], n: int) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        counts = client.call("counts")["counts"]
        if counts["err"] > before["err"]:
            raise RuntimeError(f"{name}: {counts['err'] - before['err']} runs failed")
        if counts["done"] >= before["done"] + n:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: {counts['done'] - before['done']} of {n} done "
                               f"in {DRAIN_TIMEOUT:.0f} s")
        time.sleep(0.05)


def bench_drain() -> None:
    scratch, layout = scratch_layout("needs-")
    make_queue(layout, "plain", SCRIPT, **PLAIN)
    make_queue(layout, "needs", SCRIPT, **BUDGETED)
    work = {"plain": plain_msgs(DRAIN_N), "needs": needs_msgs(DRAIN_N, max_slots=1)}
    daemons: dict[str, Daemon] = {}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in work}
    try:
        for name in work:
            daemons[name] = Daemon(layout, name)
            drain(daemons[name], layout, name, work[name][:WARM_N])  # warm: spares, caches
        for r in range(ROUNDS):  # each first in turn: drift of the machine hits both
            for name in sorted(work, reverse=bool(r % 2)):
                got[name].append(drain(daemons[name], layout, name, work[name]))
    finally:
        for daemon in daemons.values():
            daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    _report_drain(got)


def _report_drain(got: dict[str, list[tuple[float, float]]]) -> None:
    rates = {name: statistics.median(run[0] for run in runs) for name, runs in got.items()}
    cpus = {name: statistics.median(run[1] for run in runs) for name, runs in got.items()}
    how = "scopes or a delegated cgroup" if scopes.available() else "RLIMIT_AS, embedded"
    print(f"drain of {DRAIN_N:,} ({SCRIPT}), {WORKERS} workers, median of {ROUNDS}",
          flush=True)
    labels = {"plain": "drain a: plain queue, plain msgs (baseline)",
              "needs": f"drain b: budget, mixed needs ({how})"}
    for name, runs in got.items():
        spread = ", ".join(f"{run[0]:.0f}" for run in runs)
        report(labels[name], f"{rates[name]:7.0f} msgs/s (rounds: {spread}); "
               f"daemon CPU {cpus[name]:.0f} us a message")
    report("drain b vs a",
           f"{rates['needs'] / rates['plain']:7.2f}x msgs/s, "
           f"{cpus['needs'] / cpus['plain']:.2f}x daemon CPU a message")


def main() -> int:
    """``bench_needs.py [--quick] [--schedule | --drain]`` (both by default)."""
    only = {a for a in sys.argv[1:] if a in ("--schedule", "--drain")}
    if not only or "--schedule" in only:
        bench_schedule()
    if not only or "--drain" in only:
        bench_drain()
    return 0


if __name__ == "__main__":
    sys.exit(main())
