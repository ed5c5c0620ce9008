"""Crash points: the queue daemon SIGKILLed at its write-side syscalls loses nothing.

A sample spread over every (phase, syscall, N) point; ``run.py`` runs them
all (see ``cp_points``).  The checker itself is shown to catch a store that
lost or corrupted an acknowledged message.
"""

from __future__ import annotations

import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import need, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cp_points  # noqa: E402
import cp_relay  # noqa: E402
import cp_scenario  # noqa: E402
from cp_checker import check  # noqa: E402
from cp_daemon import Daemon  # noqa: E402

SAMPLE = 20


@pytest.fixture(scope="module")
def calibration():
    need(shutil.which("strace") is not None, "strace is not installed")
    try:
        yield {phase: cp_points.calibrate(phase) for phase in cp_points.PHASES}
    finally:
        cp_points.close_far_end()


def test_calibration_covers_every_operation_and_recovery(calibration):
    ops, recovery = calibration["ops"], calibration["recovery"]
    # create, group commit, attach, commit, run, delete: all rename, sync and write
    for syscall in ("rename", "fsync", "fdatasync", "syncfs", "write", "openat", "mkdir"):
        assert ops.get(syscall), f"the ops workload made no {syscall}"
    # recovery moves run/ back to que/ and removes temp directories
    assert recovery.get("rename") and recovery.get("unlinkat")
    # the cleaner removes messages one by one, and a whole shard by one rename
    assert len(calibration["prune"]["unlinkat"]) > 20
    assert calibration["prune-shard"].get("rename")
    # relay scripts' notes (relay_id) and the relayed messages' renames
    assert calibration["relay"].get("rename") and calibration["relay"].get("fsync")


def test_a_sample_of_crash_points_loses_nothing(calibration):
    points = cp_points.spread(cp_points.all_points(calibration), SAMPLE)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(cp_points.run_point, points))
    reached = [r for r in results if r.reached]
    bad = [(r.point, r.lost, r.corrupted) for r in reached if r.lost or r.corrupted]
    assert bad == []
    assert len(reached) >= SAMPLE * 3 // 4, [r.point for r in results if not r.reached]
    assert sum(r.acked for r in reached) > SAMPLE


@pytest.fixture(scope="module")
def drained(tmp_path_factory):
    """A store after the ops workload ran to its end, with what it acknowledged."""
    root = tmp_path_factory.mktemp("cp") / "root"
    layout = cp_scenario.make_root(root)
    acks = cp_scenario.Acks()
    daemon = Daemon(root, cp_scenario.QUEUE)
    try:
        daemon.wait_ready()
        assert cp_scenario.run_workload(layout, acks, cp_scenario.ops_phase)
        assert daemon.stop() == 0
    finally:
        daemon.close()
    return layout.queue_dir(cp_scenario.QUEUE), acks


def _copy(drained, tmp_path):
    qdir, acks = drained
    copy = tmp_path / "q"
    shutil.copytree(qdir, copy, symlinks=True)
    return copy, acks


def _dir_of(qdir, acks, tag):
    msg_id = next(i for i, e in acks.messages.items() if e.msg["param2"] == tag)
    return msg_id, next(p for p in qdir.glob(f"*/**/{msg_id}") if p.is_dir())


def test_checker_passes_the_store_as_left(drained, tmp_path):
    qdir, acks = _copy(drained, tmp_path)
    assert check(qdir, acks).ok
    assert len(acks.done_seen) >= 20


@pytest.mark.parametrize("harm, kind, why", [
    ("truncate msg", "corrupted", "msg unreadable"),
    ("remove message", "lost", "in no state"),
    ("change attachment", "corrupted", "attachment data.bin: MD5"),
    ("copy into err", "corrupted", "in done, err"),
    ("edit param", "corrupted", "msg fields differ in done: param3"),
])
def test_checker_catches_a_harmed_store(drained, tmp_path, harm, kind, why):
    qdir, acks = _copy(drained, tmp_path)
    msg_id, mdir = _dir_of(qdir, acks, "attached-1")
    if harm == "truncate msg":
        (mdir / "msg").write_bytes((mdir / "msg").read_bytes()[:20])
    elif harm == "remove message":
        shutil.rmtree(mdir)
    elif harm == "change attachment":
        (mdir / "attach" / "data.bin").write_bytes(b"not what was sent")
    elif harm == "copy into err":
        shutil.copytree(mdir, qdir / "err" / msg_id)
    else:
        (mdir / "msg").write_text((mdir / "msg").read_text().replace("xxx", "xxy", 1))
    verdict = check(qdir, acks)
    found = verdict.lost if kind == "lost" else verdict.corrupted
    assert [f for f in found if msg_id in f and why in f], (verdict.lost, verdict.corrupted)


def test_far_checker_catches_a_lost_and_a_doubled_relay(calibration, tmp_path):
    # Given: the relay workload run to its end (no crash): all relayed, once each
    layout = cp_scenario.make_root(tmp_path / "root")
    acks = cp_scenario.Acks()
    assert not cp_points.workload(layout, cp_points.PHASES["relay"], acks, ())
    far = cp_points.far_end()
    assert check(layout.queue_dir("relay"), acks).ok
    assert cp_relay.check_far(far, layout, acks).ok
    msg_id = next(i for i, e in acks.messages.items() if e.msg["param2"] == "relay-attached")
    far_dir = wait_for(lambda: next((d for o, cs in far.copies().items()
                                     if o.endswith(f"/{msg_id}") for s, d in cs if s == "done"),
                                    None), 30, "the far copy in done")
    # When one far copy is doubled, then gone, the checker says so
    twin = far_dir.parent / (far_dir.name + "9")
    shutil.copytree(far_dir, twin)
    assert any("2 committed copies" in c for c in cp_relay.check_far(far, layout, acks).corrupted)
    shutil.rmtree(twin)
    shutil.rmtree(far_dir)
    assert any(msg_id in lost and "no committed copy" in lost
               for lost in cp_relay.check_far(far, layout, acks).lost)
