"""rq-scan end to end: real symlinks, real inotify, real processes.

Tests run ``rqsys serve`` (the supervisor starts rq-scan and the queue
daemons) or ``rqsys scan`` alone, change the scandir the way an operator
would, and check the queue directories, the daemons' answers and the log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from scan_util import DEADLINE, call, make_entry, start_scan, start_serve, started, wait_gone

from rqsys.scan.scandir import scandir_queues
from rqsys.store import DISABLED_MARK, QueueStore


@pytest.fixture
def scandir(tmp_path: Path) -> Path:
    path = tmp_path / "scandir"
    path.mkdir()
    return path


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    return tmp_path / "scripts"


@pytest.fixture
def serve(layout, scandir, tmp_path):
    yield from started(lambda: start_serve(layout, scandir, tmp_path / "serve.log"))


@pytest.fixture
def scan(layout, scandir, tmp_path):
    yield from started(lambda: start_scan(layout, scandir, tmp_path / "scan.log"))


def effective(layout, name: str) -> dict:
    return json.loads((layout.queue_dir(name) / "config.json").read_text())


def run_to_end(layout, queue: str, **msg) -> tuple[str, str]:
    """Send a message and wait for its final state; (state, status text)."""
    msg_id = call(layout, queue, "create", msg=msg)["msg_id"]
    reply = wait_for(lambda: _final(layout, queue, msg_id), DEADLINE, f"{queue}/{msg_id} to end")
    return reply["state"], reply["status"]


def _final(layout, queue, msg_id):
    reply = call(layout, queue, "status", msg_id=msg_id)
    return reply if reply["state"] in ("done", "err") else None


def test_new_link_brings_up_a_queue_that_runs_messages(layout, scandir, scripts, serve):
    # Given rqsys serve watching an empty scandir, and a script directory elsewhere
    proc = serve()
    entry = make_entry(scripts, "greet", 'echo "done hello $RQ_PARAM1" >&3', num_workers=2)
    (entry / "form.json").write_text('{"default": "hidden"}')
    # When the operator links it in
    (scandir / "greet").symlink_to(entry)
    # Then the queue has its effective config, form link and a daemon that runs messages
    wait_for(lambda: layout.socket_path("greet").exists(), DEADLINE, "greet's socket")
    cfg = effective(layout, "greet")
    assert cfg["script"] == os.path.realpath(entry / "run") and cfg["num_workers"] == 2
    assert os.readlink(layout.queue_dir("greet") / "form.json") == str(entry / "form.json")
    assert run_to_end(layout, "greet", param1="you") == ("done", "hello you")
    assert "queue greet created from" in proc.log()


def test_link_swap_reinstalls_and_reloads_the_daemon(layout, scandir, scripts, serve):
    # Given a running queue linked to script version 1
    old = make_entry(scripts, "v1", 'echo "done v1" >&3')
    new = make_entry(scripts, "v2", 'echo "done v2" >&3', num_workers=3)
    (scandir / "work").symlink_to(old)
    proc = serve()
    assert run_to_end(layout, "work") == ("done", "v1")
    # When the link is replaced atomically, as our README says: the new link is made
    # outside the scandir, then renamed over the old one (made inside, a 'tmp' entry
    # would be a queue of its own whenever ln and mv are more than 20 ms apart)
    subprocess.run(["sh", "-c", f"ln -sfn {new} tmp && mv -T tmp {scandir}/work"],
                   cwd=scripts, check=True)
    # Then the daemon reloads the new config, and no 'tmp' queue ever appears
    proc.wait_log("work: daemon: configuration reloaded")
    assert effective(layout, "work")["script"] == str(new / "run")
    assert call(layout, "work", "config")["config"]["num_workers"] == 3
    assert run_to_end(layout, "work") == ("done", "v2")
    assert not layout.queue_dir("tmp").exists()
    assert not list(layout.trash.glob("tmp.*"))


def test_edits_inside_the_target_reload_the_daemon(layout, scandir, scripts, serve):
    # Given a running queue
    entry = make_entry(scripts, "edit", 'echo "done one" >&3')
    (scandir / "edit").symlink_to(entry)
    proc = serve()
    assert run_to_end(layout, "edit") == ("done", "one")
    # When its config.json is written inside the link's target
    (entry / "config.json").write_text('{"num_workers": 4}')
    # Then the daemon has the new config
    proc.wait_log("edit: daemon: configuration reloaded")
    assert call(layout, "edit", "config")["config"]["num_workers"] == 4
    # When a form.json appears there, it is linked; when run is rewritten, a reload
    (entry / "form.json").write_text("{}")
    wait_for(lambda: (layout.queue_dir("edit") / "form.json").is_symlink(), DEADLINE, "form link")
    (entry / "run").write_text('#!/bin/bash\necho "done two" >&3\n')
    proc.wait_log("edit: daemon: configuration reloaded", count=3)
    assert run_to_end(layout, "edit") == ("done", "two")


def test_bad_entries_make_no_queue_and_the_log_says_why(layout, scandir, scripts, scan, tmp_path):
    # Given rq-scan running
    proc = scan()
    good = make_entry(scripts, "ok", 'echo "done" >&3')
    noexec = make_entry(scripts, "noexec", "true")
    (noexec / "run").chmod(0o644)
    norun = scripts / "norun"
    norun.mkdir()
    badcfg = make_entry(scripts, "badcfg", "true", num_workers=0)
    afile = tmp_path / "a-file"
    afile.write_text("not a directory")
    # When bad entries are linked in
    bad = {"broken": tmp_path / "nowhere", "afile": afile, "bad.name": good,
           "sp ace": good, "noexec": noexec, "norun": norun, "badcfg": badcfg}
    for name, target in bad.items():
        (scandir / name).symlink_to(target)
    # Then each gets a log line saying why, and no queue
    log = proc.wait_log("no queue:", count=len(bad))
    for why in ("broken link", "not a directory", "'bad.name': no queue: invalid queue name",
                "'sp ace': no queue: invalid queue name", "noexec/run: missing or not executable",
                "norun/run: missing or not executable", "num_workers"):
        assert why in log
    assert scandir_queues(layout) == []
    # When a bad one is fixed (run made executable), the queue appears
    (noexec / "run").chmod(0o755)
    wait_for(lambda: scandir_queues(layout) == ["noexec"], DEADLINE, "noexec installed")


def test_two_hundred_links_at_once_all_come_up(layout, scandir, scripts, serve):
    # Given rqsys serve and one script directory
    proc = serve()
    entry = make_entry(scripts, "many", 'echo "done $RQ_DEST_QUEUE" >&3')
    names = [f"q{i:03d}" for i in range(200)]
    # When 200 links are created at once
    for name in names:
        (scandir / name).symlink_to(entry)
    # Then all 200 queues are installed and served (sockets bound by the supervisor)
    wait_for(lambda: all(layout.socket_path(n).exists() for n in names), 60, "200 sockets")
    assert set(names) <= set(layout.queue_names())
    assert all(effective(layout, n)["name"] == n for n in names)
    assert proc.log().count("created from") == 200
    # And a sample of them run a message (each daemon starts on its first connection)
    for name in (names[0], names[99], names[-1]):
        assert run_to_end(layout, name) == ("done", name)


def test_removal_while_a_script_runs_loses_nothing(layout, scandir, scripts, serve):
    # Given a queue whose script is running a message, and one more message queued
    entry = make_entry(scripts, "slow", f'touch {scripts}/started; sleep 60; echo "done" >&3')
    (scandir / "slow").symlink_to(entry)
    proc = serve()
    running = call(layout, "slow", "create", msg={})["msg_id"]
    queued = call(layout, "slow", "create", msg={"param1": "next"})["msg_id"]
    wait_for(lambda: (scripts / "started").exists(), DEADLINE, "the script to start")
    # When the link is removed
    (scandir / "slow").unlink()
    # Then the daemon stops (the script is requeued), and the queue moves to trash/
    proc.wait_log("queue slow moved to")
    assert not layout.queue_dir("slow").exists()
    wait_gone(layout.socket_path("slow"))
    [trashed] = layout.trash.glob("slow.*")
    store = QueueStore(trashed)
    assert store.find(running) == "que" and store.find(queued) == "que"
    assert store.read_msg("que", queued)["param1"] == "next"
    assert "slow: daemon: stopping; 1 script(s) told to stop" in proc.log()


def test_restart_picks_up_changes_made_while_down(layout, scandir, scripts, scan):
    # Given rq-scan with queues a, b, c and a timer-less root
    for name in "abc":
        (scandir / name).symlink_to(make_entry(scripts, name, 'echo "done" >&3'))
    first = scan()
    wait_for(lambda: scandir_queues(layout) == ["a", "b", "c"], DEADLINE, "a b c")
    assert first.stop() == 0
    # When, while it is down, a is removed, d added and c's config edited
    (scandir / "a").unlink()
    (scandir / "d").symlink_to(make_entry(scripts, "d", 'echo "done" >&3'))
    (scripts / "c" / "config.json").write_text('{"num_workers": 5}')
    # and b's removal had begun (marked disabled) when rq-scan was killed, b re-linked since
    layout.mark_queue("b", DISABLED_MARK, "removal begun\n")
    scan()
    # Then the restart reconciles all of them: b's removal is finished, then b made afresh
    assert scandir_queues(layout) == ["b", "c", "d"]
    assert len(list(layout.trash.glob("a.*"))) == 1
    assert len(list(layout.trash.glob("b.*"))) == 1
    assert effective(layout, "c")["num_workers"] == 5


def test_a_target_that_goes_away_keeps_the_queue_and_says_so(layout, scandir, scripts, scan):
    # Given an installed queue
    entry = make_entry(scripts, "kept", 'echo "done" >&3')
    (scandir / "kept").symlink_to(entry)
    proc = scan()
    assert scandir_queues(layout) == ["kept"]
    # When its target directory is moved away (the link is now broken)
    entry.rename(scripts / "moved")
    # Then the queue and its messages stay, and the log says why nothing changed
    proc.wait_log("'kept': no queue:")
    assert "broken link (the installed queue is kept as it was)" in proc.log()
    assert scandir_queues(layout) == ["kept"]
    # When the target comes back, the queue is re-installed from it
    (scripts / "moved").rename(entry)
    proc.wait_log("queue kept updated from")


def test_a_link_added_back_during_removal_makes_a_fresh_queue(layout, scandir, scripts, serve):
    # Given a queue with a running script
    entry = make_entry(scripts, "back", f'touch {scripts}/started; sleep 60; echo "done" >&3')
    (scandir / "back").symlink_to(entry)
    proc = serve()
    msg_id = call(layout, "back", "create", msg={})["msg_id"]
    wait_for(lambda: (scripts / "started").exists(), DEADLINE, "the script to start")
    # When the link is removed, and added back while the queue is being taken down
    (scandir / "back").unlink()
    proc.wait_log("queue back: scandir entry gone")
    (scandir / "back").symlink_to(entry)
    # Then the old queue (with its message) ends in trash/ and a fresh one is served
    proc.wait_log("queue back moved to")
    proc.wait_log("queue back created from")  # the first one came from serve's own start-up
    [trashed] = layout.trash.glob("back.*")
    assert QueueStore(trashed).find(msg_id) == "que"
    wait_for(lambda: layout.socket_path("back").exists(), DEADLINE, "back's socket again")
    assert call(layout, "back", "counts")["counts"]["que"] == 0


def test_sighup_rescans_a_scandir_created_after_start(layout, tmp_path, scripts):
    # Given rq-scan started on a scandir that does not exist yet
    from scan_util import LoggedProcess, clean_env

    scandir = tmp_path / "later"
    argv = [sys.executable, "-m", "rqsys", "--root", str(layout.root), "scan",
            "--scandir", str(scandir)]
    proc = LoggedProcess(argv, tmp_path / "later.log", clean_env())
    try:
        proc.wait_log("rq-scan ready")
        assert f"scandir {scandir} is not a directory" in proc.log()
        # When it is created with a link in it, and rq-scan gets SIGHUP
        scandir.mkdir()
        (scandir / "late").symlink_to(make_entry(scripts, "late", 'echo "done" >&3'))
        proc.proc.send_signal(signal.SIGHUP)
        # Then the queue is installed, and later links are seen by inotify
        proc.wait_log("queue late created from")
        (scandir / "later2").symlink_to(scripts / "late")
        proc.wait_log("queue later2 created from")
    finally:
        assert proc.stop() == 0
