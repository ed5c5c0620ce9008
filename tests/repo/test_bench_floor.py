"""The bench's Python floors drain what they are given, as they say they do."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import drain_floor  # noqa: E402 (the bench's own folder, added above)

SCRIPT = """#!/bin/sh
sid=$(cut -d' ' -f6 /proc/$$/stat)
if [ -e /proc/$$/fd/4 ] && [ "$sid" = "$$" ]; then echo ok >> {out}; fi
echo done >&3
"""


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "job"
    script.write_text(SCRIPT.format(out=tmp_path / "seen"))
    script.chmod(0o755)
    return script


def test_the_floor_with_rqsys_calls_runs_each_message_once_as_rqsys_starts_it(
        tmp_path: Path) -> None:
    names = drain_floor.prepare(tmp_path / "q", 40)
    fds = len(os.listdir("/proc/self/fd"))
    drain_floor.drain_with_calls(tmp_path / "q", names, _script(tmp_path), 8)
    assert sorted(os.listdir(tmp_path / "q" / "done")) == names
    assert os.listdir(tmp_path / "q" / "queue") == os.listdir(tmp_path / "q" / "run") == []
    assert (tmp_path / "seen").read_text() == "ok\n" * 40  # fd 4, its own session
    events = [line.split('"ev":"')[1].split('"')[0] for line in
              (tmp_path / "q" / "done" / names[7] / "timeline").read_text().splitlines()]
    assert events == ["started", "status", "exit", "done"]
    assert len((tmp_path / "q" / "stats.log").read_text().splitlines()) == 3 * 40
    assert len((tmp_path / "q" / "daemon.log").read_text().splitlines()) == 2 * 40
    assert len(os.listdir("/proc/self/fd")) == fds  # every run's fds closed


def test_the_plain_floor_moves_every_message_to_done(tmp_path: Path) -> None:
    names = drain_floor.prepare(tmp_path / "q", 20)
    drain_floor.drain(tmp_path / "q", names, _script(tmp_path), 2)
    assert sorted(os.listdir(tmp_path / "q" / "done")) == names
    assert not (tmp_path / "seen").exists()  # no fd 4, no session of its own
