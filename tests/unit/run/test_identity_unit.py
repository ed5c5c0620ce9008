"""rqsys.run.identity: what a daemon does with a queue's ``user``, by who it runs as.

The daemon's own uid is passed in (a real daemon's is os.geteuid); the
users are the host's (``nobody``, ``root``), the directories real ones.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from rqsys.run.identity import Identity, blocked_way, lookup

NOBODY = pwd.getpwnam("nobody")


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def event(self, kind: str, text: str, *args: object, **fields: object) -> None:
        self.lines.append((kind, text))


def identity(tmp_path: Path, cfg: dict, euid: int) -> tuple[Identity, Log]:
    log = Log()
    return Identity("q", tmp_path / "queue" / "q", log, cfg, lambda: euid), log  # type: ignore[arg-type]


def test_no_user_switches_nothing_and_refuses_nothing(tmp_path: Path) -> None:
    ident, log = identity(tmp_path, {}, 1000)
    assert (ident.switch, ident.refusal, log.lines) == (None, "", [])


def test_a_daemon_already_running_as_the_user_switches_nothing(tmp_path: Path) -> None:
    ident, log = identity(tmp_path, {"user": "nobody"}, NOBODY.pw_uid)
    assert (ident.switch, ident.refusal) == (None, "")


def test_another_unprivileged_daemon_refuses_the_queue_once_naming_both(tmp_path: Path) -> None:
    ident, log = identity(tmp_path, {"user": "nobody"}, 4242)
    assert ident.switch is None
    assert "run as user nobody" in ident.refusal and "uid 4242" in ident.refusal
    ident.configure({"user": "nobody"})  # a reload: said once
    assert [k for k, _t in log.lines] == ["err"]
    assert log.lines[0][1].endswith("no message of this queue runs; messages stay queued")
    ident.configure({})
    assert ident.refusal == "" and log.lines[-1][0] == "daemon"


@pytest.mark.parametrize(("name", "why"), [("dynamic", "DynamicUser="),
                                          ("no-such-user-rq", "does not exist on this host")])
def test_users_that_cannot_be_had_are_refused(tmp_path: Path, name: str, why: str) -> None:
    ident, _log = identity(tmp_path, {"user": name}, 0)
    assert why in ident.refusal and ident.switch is None


@pytest.fixture
def open_base(passable_tmp: Path) -> Path:
    return passable_tmp


def test_a_root_daemon_switches_and_makes_the_queue_directory_the_users(
        open_base: Path) -> None:
    qdir = open_base / "queue" / "q"
    qdir.mkdir(parents=True)
    (open_base / "queue").chmod(0o755)
    assert blocked_way(lookup("nobody"), qdir) == ""
    ident, _log = identity(open_base, {"user": "nobody"}, 0)
    assert ident.switch is not None and ident.switch.uid == NOBODY.pw_uid
    assert ident.switch.environ()["USER"] == "nobody"
    st = os.stat(qdir)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, 0o700)
    ident.configure({})  # the user removed: the daemon's again
    st = os.stat(qdir)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o755)


def test_a_directory_above_the_queue_the_user_cannot_pass_is_named(open_base: Path) -> None:
    closed = open_base / "closed"
    qdir = closed / "queue" / "q"
    qdir.mkdir(parents=True)
    closed.chmod(0o700)
    ident, _log = identity(closed.parent / "closed", {"user": "nobody"}, 0)
    assert f"cannot pass through {closed} (mode 700" in ident.refusal
