"""rqsys.run.cgroups.Delegation.setup when systemd adds a process to the unit meanwhile.

cgroupfs cannot be written on this host (v1), so the unit's cgroup is a
directory of plain files and the kernel's refusal (EBUSY while the unit's
own cgroup holds a process) is played by a stand-in for the writes.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rqsys.run import cgroups


def unit(tmp_path: Path, procs: str) -> Path:
    path = tmp_path / "rq@q.service"
    path.mkdir()
    for name, text in (("cgroup.procs", procs), ("cgroup.controllers", "cpu memory pids io"),
                       ("cgroup.subtree_control", "")):
        (path / name).write_text(text)
    return path


def test_a_process_that_joins_the_unit_is_moved_and_the_controllers_enabled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a unit whose own cgroup gains a process (an ExecReload= kill) twice
    path = unit(tmp_path, "100\n")
    joins, moved, real = ["200\n", "300\n"], [], cgroups._write
    monkeypatch.setattr(cgroups, "ENABLE_PAUSE", 0.0)

    def write(target: Path, text: str) -> None:
        if target.name == "cgroup.procs":
            moved.append(text)
            (path / "cgroup.procs").write_text("")
            return
        if target.name == "cgroup.subtree_control" and joins:
            (path / "cgroup.procs").write_text(joins.pop(0))
            raise OSError(errno.EBUSY, "Device or resource busy")
        real(target, text)
    monkeypatch.setattr(cgroups, "_write", write)
    # When the daemon sets up its delegation
    delegation = cgroups.Delegation(path)
    assert delegation.setup() == []
    # Then each process went into the daemon's leaf, and the controllers are on
    assert moved == ["100", "200", "300"]
    assert (path / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert delegation.controllers == {"memory", "cpu", "pids"}


def test_another_refusal_is_not_tried_again(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = unit(tmp_path, "")
    tries = []

    def write(target: Path, text: str) -> None:
        tries.append(target.name)
        raise OSError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(cgroups, "_write", write)
    with pytest.raises(PermissionError):
        cgroups.Delegation(path).setup()
    assert tries == ["cgroup.subtree_control"]
