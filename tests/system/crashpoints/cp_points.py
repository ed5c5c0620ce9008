"""One crash point, start to verdict, and the list of all of them.

A point is ``(phase, syscall, N)`` (see ``cp_daemon``; the phases are
``cp_scenario``'s ops and recovery, ``cp_prune``'s two and ``cp_relay``'s):
the phase's workload runs against a daemon that strace kills at the N-th
call of ``syscall``; then a plain daemon is started on the same root (its
start must succeed: recovery never crashes), drains the queue and is stopped
cleanly, and the disk is checked against the acknowledgements.  A point the
workload (and the clean stop after it) never reached is not counted.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import cp_daemon
import cp_prune
import cp_relay
import cp_scenario
from cp_checker import Verdict, check
from cp_daemon import Daemon, DaemonDied
from cp_scenario import QUEUE, Acks, Client, Layout

Point = tuple[str, str, int]
Work = Callable[[Client], None]


@dataclass(frozen=True)
class Phase:
    """A queue, what happens before its daemon starts under strace (returning the
    workload to run against it), and any check beyond the queue's own directory."""

    queue: str
    prepare: Callable[[Layout, Acks], Work]
    check_more: Callable[[Layout, Acks], Verdict] | None = None


def _ops(layout: Layout, acks: Acks) -> Work:
    return cp_scenario.ops_phase


def _recovery(layout: Layout, acks: Acks) -> Work:
    _killed_with_work(layout, acks)
    return cp_scenario.wait_final


def _prune(whole_shard: bool) -> Callable[[Layout, Acks], Work]:
    def prepare(layout: Layout, acks: Acks) -> Work:
        cp_prune.setup(layout, acks)
        return cp_prune.work_for(cp_prune.age(layout, acks, whole_shard))
    return prepare


def _relay(layout: Layout, acks: Acks) -> Work:
    cp_relay.make_relay_queue(layout)
    return cp_relay.work_for(far_end())


PHASES: dict[str, Phase] = {
    "ops": Phase(QUEUE, _ops),
    "recovery": Phase(QUEUE, _recovery),
    "prune": Phase(QUEUE, _prune(False)),
    "prune-shard": Phase(QUEUE, _prune(True)),
    "relay": Phase(cp_relay.RELAY_QUEUE, _relay,
                   lambda layout, acks: cp_relay.check_far(far_end(), layout, acks)),
}
_far: list[cp_relay.FarEnd] = []
_far_lock = threading.Lock()


def far_end() -> cp_relay.FarEnd:
    """The far end every relay point sends to, started at the first (and ended at exit,
    if no one did before)."""
    with _far_lock:
        if not _far:
            _far.append(cp_relay.FarEnd())
            atexit.register(close_far_end)
        return _far[0]


def close_far_end() -> None:
    with _far_lock:
        while _far:
            _far.pop().close()


@dataclass
class Result:
    """What one crash point showed."""

    point: Point
    reached: bool
    acks: Acks = field(default_factory=Acks)
    lost: list[str] = field(default_factory=list)
    corrupted: list[str] = field(default_factory=list)

    @property
    def acked(self) -> int:
        return len(self.acks.messages)


def run_point(point: Point, keep: Path | None = None) -> Result:
    """Crash, restart, drain, check; the root is removed unless ``keep`` names a copy."""
    root = Path(tempfile.mkdtemp(prefix="rq-crashpoint-"))
    try:
        return _run_point(root, point)
    finally:
        if keep is not None:
            shutil.copytree(root, keep, symlinks=True, ignore_dangling_symlinks=True,
                            ignore=shutil.ignore_patterns(".notify-*"))
        shutil.rmtree(root, ignore_errors=True)


def _run_point(root: Path, point: Point) -> Result:
    phase, syscall, n = PHASES[point[0]], point[1], point[2]
    layout = cp_scenario.make_root(root)
    acks = Acks()
    reached = workload(layout, phase, acks, cp_daemon.inject(syscall, n))
    result = Result(point, reached, acks)
    if not reached or not restart(layout, acks, result, phase.queue):
        return result
    verdict = check(layout.queue_dir(phase.queue), acks)
    result.lost, result.corrupted = verdict.lost, verdict.corrupted
    if phase.check_more is not None:
        more = phase.check_more(layout, acks)
        result.lost += more.lost
        result.corrupted += more.corrupted
    return result


def workload(layout: Layout, phase: Phase, acks: Acks, strace: tuple[str, ...]) -> bool:
    """The phase's workload, then a clean stop; True if strace's SIGKILL came."""
    work = phase.prepare(layout, acks)
    daemon = Daemon(layout.root, phase.queue, strace)
    try:
        daemon.wait_ready()
        if cp_scenario.run_workload(layout, acks, work, phase.queue):
            daemon.stop()
    except DaemonDied:
        pass
    finally:
        daemon.wait_dead(10)
        killed = daemon.proc.returncode == -signal.SIGKILL
        daemon.close()
    return killed


def _killed_with_work(layout: Layout, acks: Acks) -> None:
    """A plain daemon left killed with scripts running, then the gate opened."""
    daemon = Daemon(layout.root, QUEUE)
    try:
        daemon.wait_ready()
        assert cp_scenario.run_workload(layout, acks, cp_scenario.recovery_setup)
    finally:
        daemon.close()
    (layout.root / "gate").write_text("open\n")


def restart(layout: Layout, acks: Acks, result: Result, queue: str = QUEUE) -> bool:
    """A plain daemon starts, drains and stops cleanly; False (and why) if not."""
    (layout.root / "gate").write_text("open\n")
    daemon = Daemon(layout.root, queue)
    try:
        daemon.wait_ready()
        if not cp_scenario.run_workload(layout, acks, _drain, queue):
            result.corrupted.append(f"restarted daemon died: {daemon.log_tail()}")
            return False
        code = daemon.stop()
        if code != 0:
            result.corrupted.append(f"restarted daemon stopped with {code}: {daemon.log_tail()}")
            return False
    except (DaemonDied, AssertionError) as exc:
        result.corrupted.append(f"restart failed: {exc}")
        return False
    finally:
        daemon.close()
    return True


def _drain(client: cp_scenario.Client) -> None:
    """The queue may have been killed paused (between the workload's pause and resume)."""
    client.call("adminoper", oper="resume")
    cp_scenario.wait_final(client)
    cp_scenario.wait_counts(client, ("que", "run"))


def calibrate(phase: str) -> dict[str, list[int]]:
    """Per syscall, the N of its write-side calls in the phase (a run without kill)."""
    root = Path(tempfile.mkdtemp(prefix="rq-crashpoint-cal-"))
    try:
        layout = cp_scenario.make_root(root)
        traces = root / "traces"
        traces.mkdir()
        workload(layout, PHASES[phase], Acks(), cp_daemon.calibrate(traces / "t"))
        return cp_daemon.count_calls(traces / "t")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def all_points(calibration: dict[str, dict[str, list[int]]]) -> list[Point]:
    """Every (phase, syscall, N) the calibration runs reached."""
    return [(phase, syscall, n) for phase in PHASES
            for syscall, ns in sorted(calibration[phase].items()) for n in ns]


def spread(points: list[Point], count: int) -> list[Point]:
    """``count`` points spread evenly over the list (all of them if fewer)."""
    if count >= len(points):
        return points
    step = len(points) / count
    return [points[int(k * step)] for k in range(count)]
