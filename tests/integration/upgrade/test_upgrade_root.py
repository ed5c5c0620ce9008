"""An upgrade of a populated root (issue 46 item 2): the wheel of the last
commit before the on-disk format version (``OLD``) runs ``rqsys serve`` on a
root and fills it — messages in prep (one with an attachment), que (some due
later), run (killed with the whole of rqsys), done, err, relayed; a timer,
a batch, the audit trail, the statistics — then the current code starts on
the same root: it stamps the format, and every message is there once, in its
state, and those in que and run then run.  The old code runs from its own
wheel (``git archive``, ``pip wheel``), the source tree out of its reach."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from scan_util import DEADLINE, LoggedProcess, call, clean_env, free_port, make_entry

from rqsys import __version__
from rqsys.store import Layout, QueueStore, formats

OLD = "07518e9"  # the last commit before format.json: rqsys 0.1.0
REPO = Path(__file__).resolve().parents[3]
STATES = ("prep", "que", "run", "done", "err", "relayed")
SCRIPT = """grep -qx "$RQ_MSG_ID" {runs} && again=1
echo "$RQ_MSG_ID" >> {runs}
case "$RQ_PARAM1" in fail) exit 1;; slow) [ -n "$again" ] || sleep 600;; esac
echo done >&3"""  # a slow one sleeps its first run only (the one the kill cuts off)


@pytest.fixture(scope="module")
def old_site(tmp_path_factory) -> Path:
    """The old commit's wheel, installed into a directory of its own."""
    base = tmp_path_factory.mktemp("old")
    tree = subprocess.run(["git", "-C", str(REPO), "archive", OLD], check=True,
                          capture_output=True).stdout
    (base / "src").mkdir()
    subprocess.run(["tar", "-x", "-C", str(base / "src")], input=tree, check=True)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(base / "src"),
                    "-w", str(base / "wheels")], check=True, capture_output=True)
    wheel, = (base / "wheels").glob("rqsys-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(base / "site"), str(wheel)],
                   check=True, capture_output=True)
    return base / "site"


class Serve:
    """``rqsys serve`` of one code or the other on the same root."""

    def __init__(self, layout: Layout, scandir: Path, log: Path, port: int) -> None:
        self.layout, self.scandir, self.log, self.port = layout, scandir, log, port
        self.proc: LoggedProcess | None = None

    def start(self, site: Path | None) -> LoggedProcess:
        env = clean_env(RQ_SOCKET_DIR=str(self.layout.socket_dir))
        if site is not None:  # the old code first on the path, run from outside the tree
            env["PYTHONPATH"] = str(site)
        argv = [sys.executable, "-m", "rqsys", "--root", str(self.layout.root), "serve",
                "--scandir", str(self.scandir), "--port", str(self.port)]
        before = self.log.read_text().count("rq-scan ready") if self.log.exists() else 0
        cwd = os.getcwd()
        os.chdir(self.log.parent)  # python -m puts the cwd first on sys.path
        try:
            self.proc = LoggedProcess(argv, self.log, env)
        finally:
            os.chdir(cwd)
        self.proc.wait_log("rq-scan ready", count=before + 1)
        return self.proc

    def kill(self) -> None:
        """The whole of rqsys killed at once, its scripts too (a crash)."""
        assert self.proc is not None
        os.killpg(self.proc.proc.pid, signal.SIGKILL)
        self.proc.proc.wait(30)

    def http(self, method: str, path: str, body: dict | None = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=DEADLINE) as answer:
            return json.loads(answer.read())


@pytest.fixture
def serve(layout, tmp_path) -> Iterator[Serve]:
    scandir = tmp_path / "scandir"
    scandir.mkdir()
    runs = tmp_path / "runs.log"
    runs.touch()
    for name, workers in (("work", 2), ("other", 1)):
        entry = make_entry(tmp_path / "entries", name, SCRIPT.format(runs=runs),
                           num_workers=workers)
        (scandir / name).symlink_to(entry)
    server = Serve(layout, scandir, tmp_path / "serve.log", free_port())
    yield server
    if server.proc is not None and server.proc.proc.poll() is None:
        assert server.proc.stop() == 0, server.proc.log()


def inventory(layout: Layout) -> dict[str, tuple[str, str]]:
    """Every message on disk: id -> (queue, state); one found twice fails."""
    found: dict[str, tuple[str, str]] = {}
    for queue in layout.queue_names():
        store = QueueStore(layout.queue_dir(queue))
        for state in STATES:
            for msg_id in store.ids(state):
                assert msg_id not in found, (msg_id, found.get(msg_id), (queue, state))
                found[msg_id] = (queue, state)
    return found


def send(layout: Layout, param1: str, **msg) -> str:
    return str(call(layout, "work", "create", msg={"dest": "work", "param1": param1,
                                                     **msg})["msg_id"])


def state_of(layout: Layout, queue: str, msg_id: str) -> str:
    return str(call(layout, queue, "state", msg_id=msg_id)["state"])


def test_the_current_code_takes_over_a_root_the_old_one_filled(layout, serve, old_site,
                                                               tmp_path):
    serve.start(old_site)
    assert formats.read(layout.root) is None  # the old code wrote no version
    done = [send(layout, f"ok{n}") for n in range(3)]
    err = [send(layout, "fail") for _ in range(2)]
    wait_for(lambda: all(state_of(layout, "work", i) == "done" for i in done)
             and all(state_of(layout, "work", i) == "err" for i in err), DEADLINE, "ends")
    later = [send(layout, "later", due=time.time() + 3600) for _ in range(2)]
    body = b"attached bytes\n"
    (tmp_path / "a.bin").write_bytes(body)
    prep = str(call(layout, "work", "create", msg={"dest": "work"}, state="prep")["msg_id"])
    fd = os.open(tmp_path / "a.bin", os.O_RDONLY)
    try:
        call(layout, "work", "attach", fds=[fd], msg_id=prep, name="a.bin",
             md5=hashlib.md5(body).hexdigest())
    finally:
        os.close(fd)
    relayed = str(call(layout, "relay", "create", msg={
        "dest": f"http://127.0.0.1:{serve.port}/q/other", "force_remote": True,
        "param1": "relayed"})["msg_id"])
    wait_for(lambda: state_of(layout, "relay", relayed) == "relayed", DEADLINE, "the relay")
    batch = serve.http("POST", "/batches", {"messages": [{"dest": "work", "param1": "b1"}]})
    slow = [send(layout, "slow") for _ in range(2)]
    wait_for(lambda: all(state_of(layout, "work", i) == "run" for i in slow), DEADLINE,
             "the slow ones running")
    queued = [send(layout, f"q{n}") for n in range(3)]  # behind the two slow ones
    (layout.timers / "tick.json").write_text(json.dumps(
        {"period": 3600, "msg": {"dest": "other", "param1": "tick"}}))
    serve.proc.wait_log("tick")  # rq-scan took the timer
    before = inventory(layout)
    assert all(before[i][1] == "run" for i in slow) and all(before[i][1] == "que"
                                                             for i in queued)
    serve.kill()

    # The current code on the same root
    proc = serve.start(None)
    assert formats.read(layout.root) == formats.FORMAT
    assert "on-disk format 0, migrating to 1" in proc.log()
    after = inventory(layout)
    assert set(after) >= set(before), set(before) - set(after)  # none lost
    for msg_id in [*done, *err, *later, prep, relayed]:
        assert after[msg_id] == before[msg_id], msg_id  # ended ones, prep, due later: as were
    # those queued and those the kill cut off run (again: at least once), to done
    wait_for(lambda: all(state_of(layout, "work", i) == "done" for i in [*queued, *slow]),
             DEADLINE, "the queued and the cut-off ones")
    runs = (tmp_path / "runs.log").read_text().split()
    assert all(runs.count(i) == 1 for i in queued) and all(runs.count(i) == 2 for i in slow)
    store = QueueStore(layout.queue_dir("work"))
    assert [p.read_bytes() for p in store.attachments("prep", prep)] == [body]
    assert serve.http("GET", f"/batches/{batch['id']}.json")["total"] == 1
    assert "tick" in json.dumps(serve.http("GET", "/timers.json"))
    rq = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; "
          "sys.exit(rq_main())"]
    audit = subprocess.run([*rq, "audit", "--queue", "work", "--action", "attach"],
                           capture_output=True, text=True, check=True,
                           env=clean_env(RQ_ROOT=str(layout.root))).stdout
    assert f"attach work {prep}" in audit  # the old code's record, read by the new
    stats = call(layout, "work", "stats")
    assert stats["totals"]["done"] >= len(done) + 1, stats  # kept across the upgrade


def test_a_root_of_a_newer_format_is_refused_by_every_program(layout, tmp_path):
    (layout.root / formats.FILE).write_text('{"format": 99, "by": "rqsys 9.0"}\n')
    want = (f"rqsys: the state root {layout.root} is in on-disk format 99, newer than this "
            f"rqsys ({__version__}) knows (format {formats.FORMAT}): run the rqsys that "
            "wrote it, or a newer one\n")
    for argv in (["serve", "--port", str(free_port())], ["queue", "work"], ["scan"], ["web"]):
        done = subprocess.run([sys.executable, "-m", "rqsys", "--root", str(layout.root),
                               *argv], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path, env=clean_env(RQ_SOCKET_DIR=str(tmp_path)))
        assert (done.returncode, done.stderr) == (formats.EXIT_NEWER, want), argv
    assert not (layout.root / "queue" / "work").exists()  # nothing was touched
