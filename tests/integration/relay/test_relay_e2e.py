"""Relaying between two real rqsys instances, each in its own network namespace.

Hosts ``a`` and ``b`` each run ``rqsys serve`` (queue daemons, the web front
end, the built-in relay queue running relay.py).  Messages are sent the way
a user sends them (``rq sendmesg``, a script's ``dup``) and the proof of
"exactly once" is b's own store.  Crashes are real: the relay queue daemon
is SIGKILLed while its script is at a chosen step (the script stops there
once when RELAY_HOLD_AT is set, and dies with its daemon); the supervisor
restarts the daemon, which requeues the message, and the relay resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, need, wait_for
from netns import NetLab, Rqsys, netns_available

from rqsys.scripts.relay import RUN_MARK
from rqsys.special import special_config
from rqsys.store import STATES, QueueStore, file_md5

RQ = [str(Path(sys.executable).parent / "rq")]
WORK = "#!/bin/bash\necho \"done got $RQ_PARAM1\" >&3\n"
DUP = """#!/bin/bash
echo "dup 0-X-$RQ_PARAM2" >&3
read -r -u 4 answer
echo "done dup said: $answer" >&3
"""
PONG = DUP.replace("$RQ_PARAM2", "$RQ_PARAM3")
RELAY_ENV = {"BACKOFF_UNIT": "0.2", "BACKOFF_MAX": "2", "RELAY_TIMEOUT": "10"}


def add_queue(host: Rqsys, name: str, script: str) -> None:
    entry = host.scandir / name
    entry.mkdir()
    (entry / "run").write_text(script)
    (entry / "run").chmod(0o755)


def set_relay_env(host: Rqsys, **extra: str) -> None:
    cfg = special_config("relay")
    cfg["env_vars"] = dict(RELAY_ENV, **extra)
    host.layout.create_queue_dir("relay", cfg)


class World:
    c: Rqsys  # a host whose web wants basic auth

    def __init__(self, lab: NetLab, a: Rqsys, b: Rqsys) -> None:
        self.lab, self.a, self.b = lab, a, b
        self.work = f"{b.url}q/work"

    def rq(self, *args: str) -> str:
        got = subprocess.run([*RQ, "--root", str(self.a.layout.root), *args],
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stderr
        word, _, rest = got.stdout.strip().partition(" ")
        assert word == "ok", got.stdout
        return rest

    def relay_get(self, url: str) -> dict[str, Any]:
        return self.a.call("relay", "get", msg_id=url.rsplit("/", 1)[1])

    def relay_runs(self, url: str) -> int:
        """How many times the relay script ran for the message (its log says)."""
        msg_id = url.rsplit("/", 1)[1]
        (log,) = self.a.layout.queue_dir("relay").rglob(f"{msg_id}/job/stdio.log")
        return log.read_text().count(RUN_MARK)

    def wait_relay(self, url: str, state: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(lambda: (got := self.relay_get(url))["state"] == state and got,
                        timeout, f"{url} in {state}")

    def far_ids(self, queue: str = "work") -> dict[str, list[str]]:
        """Every message of b's queue, by state, read from b's store."""
        store = QueueStore(self.b.layout.queue_dir(queue))
        return {s: list(store.ids(s)) for s in STATES if list(store.ids(s))}

    def new_far(self, before: dict[str, list[str]]) -> dict[str, list[str]]:
        """b's work messages that were not there ``before``, by state."""
        old = {i for ids in before.values() for i in ids}
        now = {s: [i for i in ids if i not in old] for s, ids in self.far_ids().items()}
        return {s: ids for s, ids in now.items() if ids}

    def far_count(self, queue: str = "work") -> int:
        return sum(len(ids) for ids in self.far_ids(queue).values())

    def far_done(self, url: str) -> dict[str, Any]:
        msg_id = url.rsplit("/", 1)[1]
        return wait_for(lambda: (got := self.b.call("work", "get", msg_id=msg_id))["state"]
                        == "done" and got, 30, f"{url} done on b")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    need(netns_available(), "network namespaces need root and iproute2")
    need(REPO.joinpath("rqsys", "web", "app.py").exists(),
         "the web front end (rqsys/web/app.py)")
    base = tmp_path_factory.mktemp("e2e")
    lab = NetLab()
    hosts: list[Rqsys] = []
    try:
        for name in ("a", "b", "c"):
            lab.host(name)
            host = Rqsys(lab, name, base / name)
            set_relay_env(host)
            hosts.append(host)
        a, b, c = hosts
        c.layout.config_file.write_text(json.dumps({
            "host": c.addr, "port": c.port, "addr": "0.0.0.0",
            "basic_auth": {"realm": "rq", "users": {"relay": "s3cret"}}}))
        add_queue(c, "work", WORK)
        add_queue(a, "fan", DUP)
        add_queue(a, "ping", DUP)
        add_queue(b, "work", WORK)
        add_queue(b, "pong", PONG)
        for host in hosts:
            host.start(wait_queues=("relay",))
            auth = "relay:s3cret" if host is c else ""
            wait_for(lambda h=host, au=auth: h.http_ok(au), 30, f"the web of {host.host}")
        world = World(lab, a, b)
        world.c = c
        yield world
    finally:
        for host in hosts:
            host.stop()
        lab.close()


def test_plain_relay(world: World) -> None:
    # When a user on a sends a message to b's queue
    url = world.rq("sendmesg", "--dest", world.work, "--param1", "hello")
    assert "/q/relay/" in url  # it went to a's relay queue
    # Then it is relayed, and done on b
    got = world.wait_relay(url, "relayed")
    far = world.far_done(got["status"])
    assert far["status"] == "got hello" and far["msg"]["orig_msg_id"] == url
    assert world.rq("statusmesg", "--msg_id", url) == f"relayed - {got['status']}"


def test_three_attachments_one_of_500_mb(world: World, tmp_path: Path) -> None:
    # Given three attachments, one a 500 MB file (sparse here, uploaded in full)
    big = tmp_path / "big.img"
    with open(big, "wb") as out:
        out.truncate(500 << 20)
        out.seek(123 << 20)
        out.write(b"a few bytes in the middle")
    small = tmp_path / "small.txt"
    small.write_text("small\n")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(2 << 20))
    url = world.rq("sendmesg", "--dest", world.work, "--attach", str(big), "--attach",
                   str(small), "--attach", str(blob))
    # When it is relayed (watching the peak memory of the relay script, or of the
    # relay worker the daemon handed it to, meanwhile)
    msg_id, peak_kb = url.rsplit("/", 1)[1], 0
    assert world.a.proc is not None
    while (got := world.relay_get(url))["state"] != "relayed":
        assert got["state"] in ("que", "run"), got["status"]
        peak_kb = max(peak_kb, script_peak_rss_kb(msg_id, world.a.proc.pid))
        time.sleep(0.05)
    far = world.far_done(got["status"])
    # Then all three arrived whole (MD5 and size), as one message
    for path in (big, small, blob):
        assert far["attachments"][path.name]["md5"] == file_md5(path)
        assert far["attachments"][path.name]["size"] == path.stat().st_size
    # And the 500 MB were streamed, not read into the script's memory
    assert 0 < peak_kb < 100_000


def script_peak_rss_kb(msg_id: str, supervisor: int) -> int:
    """Peak RSS (VmHWM) of the running queue script of ``msg_id`` and of the relay
    worker ``supervisor`` started (its peak since it started), 0 if none runs."""
    peak = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            worker = (int(stat[1]) == supervisor and b"rqsys.scripts.relayworker"
                      in Path(f"/proc/{pid}/cmdline").read_bytes())
            if f"RQ_MSG_ID={msg_id}".encode() not in env and not worker:
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            continue
    return peak


def test_dup_to_remote_queue_answers_ok(world: World) -> None:
    # A script's dup to b's URL is answered "ok <id>" and the copy arrives
    before = world.far_count()
    url = world.rq("sendmesg", "--dest", "fan", "--param2", world.work, "--param1", "dupped")
    fan_id = url.rsplit("/", 1)[1]
    fan = wait_for(lambda: (g := world.a.call("fan", "get", msg_id=fan_id))["state"] == "done"
                   and g, 30, "fan done")
    answer = fan["status"].removeprefix("dup said: ")
    assert answer.startswith("ok ") and "/q/relay/" in answer
    got = world.wait_relay(answer[3:], "relayed")
    far = world.far_done(got["status"])
    assert far["status"] == "got dupped" and world.far_count() == before + 1


def test_far_end_down_then_back_arrives_once(world: World) -> None:
    # Given b stopped
    before = world.far_ids()
    world.b.stop()
    try:
        urls = [world.rq("sendmesg", "--dest", world.work, "--param1", f"patient{n}")
                for n in range(3)]
        # Then each message waits and resends
        for url in urls:
            wait_for(lambda u=url: int(world.relay_get(u)["msg"].get("count", 0)) >= 2, 30,
                     "two failed attempts")
            assert world.relay_get(url)["state"] != "relayed"
    finally:
        world.b.start(wait_queues=("work",))
    # When b is back, each arrives exactly once
    for n, url in enumerate(urls):
        got = world.wait_relay(url, "relayed")
        assert world.far_done(got["status"])["status"] == f"got patient{n}"
    # (a prep whose answer timed out while b was starting stays an orphan in
    # prep, never committed: see "orphan prepared message" in SPECIAL-QUEUES.md)
    committed = {s: ids for s, ids in world.new_far(before).items() if s != "prep"}
    assert len(committed.get("done", [])) == 3 == sum(len(ids) for ids in committed.values())
    for orphan in world.new_far(before).get("prep", []):
        world.b.call("work", "delete", msg_id=orphan)  # tidy b for the other tests


@pytest.mark.parametrize("step, far_states", [("uploaded", {"prep"}),
                                               ("committed", {"que", "run", "done"})])
def test_relay_crash_resumes_without_second_copy(world: World, tmp_path: Path, step: str,
                                                  far_states: set[str]) -> None:
    # Given a relay that stops once after the given step...
    set_relay_env(world.a, RELAY_HOLD_AT=step)
    world.a.call("relay", "reload")
    before = world.far_ids()
    try:
        data = tmp_path / "payload"
        data.write_bytes(os.urandom(100_000))
        url = world.rq("sendmesg", "--dest", world.work, "--attach", str(data))
        msg_id = url.rsplit("/", 1)[1]
        note = world.a.layout.queue_dir("relay") / "run" / msg_id / "job" / f"held-{step}"
        wait_for(note.exists, 30, f"the relay to reach {step}")
        wait_for(lambda: world.new_far(before), 10, "the copy on b")
        (state, ids), = world.new_far(before).items()  # one copy: prepared, or committed
        assert state in far_states and len(ids) == 1
        # ...when the relay queue daemon and its script die (SIGKILL)
        pid = world.a.call("relay", "ping")["pid"]
        os.kill(pid, signal.SIGKILL)
        # Then the supervisor restarts it, the relay resumes from relay_id
        got = wait_for(lambda: _state_after_restart(world, url, pid), 60, "relayed after restart")
        relay_id = world.a.layout.queue_dir("relay") / "relayed" / msg_id[:11] / msg_id / "job"
        assert got["status"] == (relay_id / "relay_id").read_text().strip()
    finally:
        set_relay_env(world.a)
        _reload_when_up(world)
    # And b holds exactly one copy, committed and done
    far_url = world.relay_get(url)["status"]
    far = world.far_done(far_url)
    assert far["attachments"]["payload"]["md5"] == hashlib.md5(data.read_bytes()).hexdigest()
    assert world.new_far(before) == {"done": [far["msg"]["msg_id"]]}


def test_a_committed_relay_whose_far_copy_was_cleaned_is_not_sent_again(world: World) -> None:
    # Given a relay that stops once after its commit, whose far copy then runs and
    # is deleted there (a cleaner)...
    set_relay_env(world.a, RELAY_HOLD_AT="committed")
    world.a.call("relay", "reload")
    before = world.far_ids()
    try:
        url = world.rq("sendmesg", "--dest", world.work)
        msg_id = url.rsplit("/", 1)[1]
        note = world.a.layout.queue_dir("relay") / "run" / msg_id / "job" / "held-committed"
        wait_for(note.exists, 30, "the relay to reach its commit")
        (_state, (far_id,)), = world.new_far(before).items()
        wait_for(lambda: world.b.call("work", "state", msg_id=far_id)["state"] == "done", 30,
                 "done on b")
        world.b.call("work", "delete", msg_id=far_id)
        # ...when the relay queue daemon and its script die (SIGKILL)
        pid = world.a.call("relay", "ping")["pid"]
        os.kill(pid, signal.SIGKILL)
        # Then the rerun finds it gone from b, knows it committed it, and says relayed
        # (it prepared it again: b ran it twice; a review found it)
        got = wait_for(lambda: _state_after_restart(world, url, pid), 60, "relayed after restart")
        assert got["status"].endswith(far_id)
    finally:
        set_relay_env(world.a)
        _reload_when_up(world)
    assert world.new_far(before) == {}  # no second copy on b


def _state_after_restart(world: World, url: str, old_pid: int) -> dict[str, Any] | None:
    try:
        if world.a.call("relay", "ping")["pid"] == old_pid:
            return None
        got = world.relay_get(url)
    except Exception:  # noqa: BLE001 - being restarted
        return None
    return got if got["state"] == "relayed" else None


def _reload_when_up(world: World) -> None:
    wait_for(lambda: world.a.pingable("relay"), 30, "relay queue up")
    world.a.call("relay", "reload")


def test_corrupted_attachment_is_never_committed(world: World, tmp_path: Path) -> None:
    # Given a message whose attachment got damaged on a's disk after it was stored
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(50_000))
    fd = os.open(data, os.O_RDONLY)
    try:
        reply = world.a.call("relay", "create", fds=[fd], msg={
            "dest": world.work, "due": time.time() + 3600},
            attachments=[{"name": "data.bin", "md5": hashlib.md5(data.read_bytes()).hexdigest()}])
    finally:
        os.close(fd)
    msg_id = reply["msg_id"]
    stored = world.a.layout.queue_dir("relay") / "que" / msg_id / "attach" / "data.bin"
    damaged = bytearray(stored.read_bytes())
    damaged[100] ^= 0xFF
    stored.unlink()  # a new inode: the sender's file stays intact
    stored.write_bytes(damaged)
    before = world.far_ids()
    # When it is relayed
    world.a.call("relay", "run_now", msg_id=msg_id)
    # Then b echoes another MD5: retried, and b never commits it
    got = wait_for(lambda: int((g := world.a.call("relay", "get", msg_id=msg_id))["msg"]
                               .get("count", 0)) >= 3 and "MD5 mismatch" in g["status"] and g,
                   60, "three attempts that failed on the MD5")
    assert got["state"] in ("que", "run")
    far = world.far_ids()
    assert len(far["prep"]) == 1  # prepared once, re-uploaded on each retry
    assert {s: ids for s, ids in far.items() if s != "prep"} == before
    world.a.call("relay", "destroy", msg_id=msg_id)
    world.b.call("work", "delete", msg_id=far["prep"][0])  # tidy b for the other tests


def test_relay_loop_ends_in_err(world: World) -> None:
    # Given a's ping, which dups to b's pong, which dups back to a's ping, ...
    world.rq("sendmesg", "--dest", "ping", "--param2", f"{world.b.url}q/pong",
             "--param3", f"{world.a.url}q/ping")
    # Then the third relay hop finds a in relay_via: err at a's relay, naming the loop
    relay_a = QueueStore(world.a.layout.queue_dir("relay"))
    looped = wait_for(lambda: _loop_err(relay_a), 60, "a relay loop err")
    assert f"relay loop: {world.a.url} already relayed this message" in looped
    assert f"via {world.a.url} -> {world.b.url}" in looped
    relay_b = QueueStore(world.b.layout.queue_dir("relay"))
    # (b's relay may end after a's err: its process exits once the commit is answered)
    wait_for(lambda: relay_b.count("relayed") >= 1, 30, "b's relay to end relayed")
    assert not _loop_err(relay_b)


def _loop_err(store: QueueStore) -> str:
    for msg_id in store.ids("err"):
        status = store.read_status("err", msg_id)
        if "relay loop" in status:
            return status
    return ""


def test_relay_via_is_sent(world: World) -> None:
    url = world.rq("sendmesg", "--dest", world.work)
    got = world.wait_relay(url, "relayed")
    far = world.far_done(got["status"])
    assert far["msg"]["relay_via"] == [world.a.url]
    assert json.loads(json.dumps(far["msg"]))["dest"] == "work"


def test_relay_with_basic_auth_credentials_in_the_url(world: World) -> None:
    c = world.c
    # With the right credentials in the dest URL, the message arrives
    url = world.rq("sendmesg", "--dest", f"http://relay:s3cret@{c.addr}:{c.port}/q/work")
    got = world.wait_relay(url, "relayed")
    far_id = got["status"].rsplit("/", 1)[1]
    wait_for(lambda: c.call("work", "state", msg_id=far_id)["state"] == "done", 30, "done on c")
    # With a wrong password, the relay ends in err with the far end's reason
    url = world.rq("sendmesg", "--dest", f"http://relay:wrong@{c.addr}:{c.port}/q/work")
    got = world.wait_relay(url, "err")
    assert "HTTP 401" in got["status"] or "wrong user name or password" in got["status"]
    assert world.relay_runs(url) == 1  # refused, not retried


@pytest.mark.parametrize("step, far_states", [("uploaded", {"prep"}),
                                               ("committed", {"que", "run", "done"})])
def test_relay_script_killed_alone_leaves_at_most_one_copy(world: World, step: str,
                                                           far_states: set[str]) -> None:
    # Given a relay script stopped after the given step...
    set_relay_env(world.a, RELAY_HOLD_AT=step)
    world.a.call("relay", "reload")
    before = world.far_ids()
    try:
        url = world.rq("sendmesg", "--dest", world.work)
        msg_id = url.rsplit("/", 1)[1]
        note = world.a.layout.queue_dir("relay") / "run" / msg_id / "job" / f"held-{step}"
        wait_for(lambda: note.exists() and note.read_text().strip(), 30, f"{step}")
        # ...when only the script is SIGKILLed
        os.kill(int(note.read_text()), signal.SIGKILL)
        got = world.wait_relay(url, "err")
    finally:
        set_relay_env(world.a)
        world.a.call("relay", "reload")
    # Then RQ's exit rule makes it err, keeping relay_id (the far URL) for the operator,
    # and the far end holds one copy: never committed, or committed once
    assert "signal" in got["status"] or "SIGKILL" in got["status"]
    (state, ids), = world.new_far(before).items()
    assert state in far_states and len(ids) == 1
    job = world.a.layout.queue_dir("relay") / "err" / msg_id / "job"
    assert (job / "relay_id").read_text().strip().endswith(ids[0])
    if state == "prep":
        world.b.call("work", "delete", msg_id=ids[0])  # tidy b for the other tests
