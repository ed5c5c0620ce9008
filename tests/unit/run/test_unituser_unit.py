"""rqsys.run.unituser: a queue's user as a drop-in, and its directory handed over (as root)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
from pathlib import Path

import pytest

from rqsys.errors import ConfigError
from rqsys.run import unituser
from rqsys.run.identity import dynamic_name
from rqsys.store import Layout

NOBODY = pwd.getpwnam("nobody")
RQSYS = "/opt/rq/bin/rqsys"


def test_a_named_user_runs_the_unit_as_it_with_group_rq_and_the_hand_over(
        tmp_path: Path) -> None:
    group = grp.getgrgid(NOBODY.pw_gid).gr_name
    text = unituser.drop_in("q", {"user": "nobody"}, tmp_path / "queue" / "q", RQSYS)
    assert text.endswith(f"[Service]\nUser=nobody\nGroup={group}\nRemoveIPC=no\n"
                         f"SupplementaryGroups=rq\nExecStartPre=+{RQSYS} queue-owner %i\n")


def test_dynamic_gets_a_dynamic_user_named_after_the_queue(tmp_path: Path) -> None:
    text = unituser.drop_in("etl-7", {"user": "dynamic"}, tmp_path / "queue" / "q", RQSYS)
    assert "\nDynamicUser=yes\nUser=rq-etl-7\nSupplementaryGroups=rq\n" in text
    long = dynamic_name("a" * 64)
    assert len(long) == 31 and long.startswith("rq-aaaa") and long != dynamic_name("a" * 63)


def test_no_user_no_drop_in_until_the_directory_must_be_given_back(tmp_path: Path) -> None:
    (tmp_path / "queue" / "q").mkdir(parents=True)
    assert unituser.drop_in("q", {}, tmp_path / "queue" / "q", RQSYS) == ""
    assert unituser.drop_in("q", {"user": "no-such-user-rq"}, tmp_path / "queue" / "q",
                            RQSYS) == ""
    if os.geteuid() == 0:  # once handed to another user, only the hand-back is left
        os.chown(tmp_path / "queue" / "q", NOBODY.pw_uid, -1)
        text = unituser.drop_in("q", {}, tmp_path / "queue" / "q", RQSYS)
        assert text.endswith(f"[Service]\nExecStartPre=+{RQSYS} queue-owner %i\n")


def test_hand_over_walks_the_tree_once_and_sets_the_top_last(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("chown to another user needs root (CI runs as root)")
    top = tmp_path / "q"
    (top / "que" / "m1" / "job").mkdir(parents=True)
    (top / "que" / "m1" / "msg").write_text("{}")
    (top / "form.json").symlink_to("/nonexistent")
    (top / "que").chmod(0o750)
    uid, gid = NOBODY.pw_uid, NOBODY.pw_gid
    assert unituser.hand_over(top, uid, gid, unituser.PRIVATE_MODE) == 6
    for path in (top, top / "que", top / "que/m1/msg", top / "form.json"):
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == (uid, gid), path
    assert stat.S_IMODE(os.stat(top).st_mode) == 0o2750
    assert stat.S_IMODE(os.stat(top / "que").st_mode) == 0o2750  # its mode, setgid
    assert unituser.hand_over(top, uid, gid, unituser.PRIVATE_MODE) == 0  # nothing walked


def test_target_follows_the_config_and_needs_the_console_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(tmp_path / "root", tmp_path / "sock")
    layout.make_dirs()
    qdir = layout.queue_dir("q")
    qdir.mkdir()
    cfg = {"name": "q", "script": "/bin/true", "user": "nobody"}
    (qdir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="group rq-web does not exist"):
        unituser.target(layout, "q")
    real = grp.getgrnam
    monkeypatch.setattr(grp, "getgrnam", lambda name: real("nogroup" if name == "rq-web"
                                                           else name))
    assert unituser.target(layout, "q") == (NOBODY.pw_uid, real("nogroup").gr_gid, 0o2750)
    (qdir / "config.json").write_text(json.dumps({"name": "q", "script": "/bin/true"}))
    shared = os.stat(layout.queues)
    assert unituser.target(layout, "q") == (shared.st_uid, shared.st_gid, 0o2770)
