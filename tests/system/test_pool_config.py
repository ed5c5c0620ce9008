"""Pool queues on one host: the config, the start error when NATS is not
there (a plain queue beside it keeps working), nothing of NATS imported by
a plain queue, ids unique across hosts, and one real nats-server on
loopback: publish-then-ok, run, ack, resend through the pool, lookups from
the pool's bucket, bad credentials."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats_util
import pytest
from conftest import REPO, DaemonProcess, need, wait_for
from nats_util import OK, LocalNats, free_port, nats_available, pause_pulls, use_nats

from rqsys import config
from rqsys.errors import ConfigError
from rqsys.pool.ids import PoolIds, host_of
from rqsys.pool.link import public_url
from rqsys.store import MSG_ID_RE, Layout
from rqsys.store.layout import TMP_DIR

RESEND_ONCE = ('if [ "$RQ_COUNT" = 0 ]; then echo "resend 0-once more" >&3; exit 0; fi\n'
               'echo "done second run, count $RQ_COUNT" >&3\n')

solo = nats_util.solo  # the fixture (one nats-server on loopback)
pool_queue = nats_util.pool_queue  # the fixture (a pool queue on it)


@pytest.mark.parametrize(("pool", "field"), [
    ({"replicas": 3}, "pool"), ({"name": "a b"}, "pool/name"),
    ({"name": "p", "replicas": 9}, "pool/replicas"), ({"name": "p", "ack_wait": 0},
                                                        "pool/ack_wait"),
    ({"name": "p", "color": "red"}, "pool")])
def test_bad_pool_config_names_the_field(pool: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=f"cfg: {field}: "):
        config.queue_config("q", "/bin/true", {"pool": pool}, source="cfg")


@pytest.mark.parametrize(("nats", "field"), [
    ({"servers": []}, "nats/servers"), ({"servers": ["http://x:4222"]}, "nats/servers/0"),
    ({"tls": {"ca": ""}}, "nats/tls/ca"), ({"connect_timeout": 0}, "nats/connect_timeout"),
    ({"server": ["nats://x"]}, "nats")])
def test_bad_nats_config_names_the_field(layout: Layout, nats: dict[str, Any],
                                         field: str) -> None:
    layout.config_file.write_text(json.dumps({"nats": nats}))
    with pytest.raises(ConfigError, match=f"config.json: {field}: "):
        config.load_system_config(layout)


def test_pool_ids_are_rq_ids_naming_their_host() -> None:
    makers = [PoolIds(n) for n in (1, 2, 57)]
    ids = [m.next_id() for _ in range(300) for m in makers]
    assert len(set(ids)) == len(ids)
    assert all(MSG_ID_RE.match(i) for i in ids)
    assert {host_of(i) for i in ids} == {1, 2, 57}
    with pytest.raises(ValueError):
        PoolIds(100)


def test_a_plain_queue_imports_nothing_of_nats(layout: Layout,
                                               make_queue: Callable[..., Path]) -> None:
    make_queue("plain", OK)
    code = ("import sys; from rqsys.store import Layout; from rqsys.daemon.loop import QueueDaemon;"
            f"QueueDaemon(Layout.from_root({str(layout.root)!r}), 'plain');"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'nats'"
            " or m.startswith('rqsys.pool.')))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert got.stdout.strip() == "[]"


def test_unreachable_nats_fails_the_start_plain_queues_work(
        layout: Layout, make_queue: Callable[..., Path],
        daemon: Callable[..., DaemonProcess]) -> None:
    # Given a pool queue whose NATS server is not there, and a plain queue
    port = free_port()
    use_nats(layout, f"nats://127.0.0.1:{port}")
    make_queue("pq", OK, pool={"name": "p1", "replicas": 1})
    make_queue("plain", OK)
    # When the pool queue's daemon starts, it exits 1 saying why
    with pytest.raises(AssertionError, match="daemon exited 1") as failed:
        daemon("pq")
    assert f"rqsys: pool p1: cannot reach NATS at nats://127.0.0.1:{port}" in str(failed.value)
    # And the plain queue works all the same
    plain = daemon("plain")
    got = plain.call("create", msg={"dest": "plain", "param1": "x"})
    wait_for(lambda: plain.call("get", msg_id=got["msg_id"])["state"] == "done", 10, "done")


def test_bad_credentials_fail_the_start(tmp_path: Path, layout: Layout,
                                        make_queue: Callable[..., Path],
                                        daemon: Callable[..., DaemonProcess]) -> None:
    need(nats_available(), "nats-server (Debian package nats-server)")
    server = LocalNats(tmp_path / "nats-auth", extra='authorization { user: rq, password: s3 }')
    try:
        use_nats(layout, f"nats://rq:wrong@127.0.0.1:{server.port}")
        make_queue("pq", OK, pool={"name": "p2", "replicas": 1})
        with pytest.raises(AssertionError, match="daemon exited 1") as failed:
            daemon("pq")
        assert "rqsys: pool p2: " in str(failed.value)
        assert "uthorization" in str(failed.value)  # NATS's own word for it
        assert "wrong" not in str(failed.value)  # the password is not shown
    finally:
        server.stop()


def test_good_credentials_are_not_in_the_log(tmp_path: Path, layout: Layout,
                                            make_queue: Callable[..., Path],
                                            daemon: Callable[..., DaemonProcess]) -> None:
    need(nats_available(), "nats-server (Debian package nats-server)")
    server = LocalNats(tmp_path / "nats-auth", extra='authorization { user: rq, password: s3Pw }')
    try:
        # Given a pool queue whose NATS URL carries its user and password
        use_nats(layout, f"nats://rq:s3Pw@127.0.0.1:{server.port}")
        make_queue("pq", OK, pool={"name": "p2", "replicas": 1})
        # When its daemon joins the pool
        pq = daemon("pq")
        wait_for(lambda: "joined as host" in pq.stderr_text(), 10, "the join line")
        # Then the log names the server and the user, never the password
        assert f"(nats://rq:***@127.0.0.1:{server.port})" in pq.stderr_text()
        assert "s3Pw" not in pq.stderr_text()
        pq.stop()
    finally:
        server.stop()


@pytest.mark.parametrize(("url", "shown"), [
    ("nats://rq:pw@h:4222", "nats://rq:***@h:4222"),
    ("nats://t0ken@h:4222", "nats://***@h:4222"),  # a token: NATS's user part alone
    ("nats://h:4222", "nats://h:4222"),
])
def test_a_servers_secret_is_not_shown(url: str, shown: str) -> None:
    assert public_url(url) == shown


def test_pool_queue_on_one_server(pool_queue: Callable[..., DaemonProcess]) -> None:
    # Given a pool queue with one nats-server
    pq = pool_queue("p3", num_workers=2)
    # When messages are created, each is answered with a pool id of host 1
    ids = [pq.call("create", msg={"dest": "pq", "param1": f"m{n}"})["msg_id"]
           for n in range(5)]
    assert {host_of(i) for i in ids} == {1}
    # Then each runs here once, and ends done with count 0
    for n, msg_id in enumerate(ids):
        got = wait_for(lambda i=msg_id: (g := pq.call("get", msg_id=i))["state"] == "done"
                       and g, 15, f"{msg_id} done")
        assert got["status"] == f"ran m{n} count 0"
    # And an id made by another host is looked up in the pool's bucket
    other = PoolIds(2).next_id()
    with pytest.raises(Exception, match=f"no message {other} in pool p3"):
        pq.call("get", msg_id=other)


def test_resend_goes_back_to_the_pool(pool_queue: Callable[..., DaemonProcess]) -> None:
    pq = pool_queue("p4", RESEND_ONCE)
    msg_id = pq.call("create", msg={"dest": "pq"})["msg_id"]
    got = wait_for(lambda: (g := pq.call("get", msg_id=msg_id))["state"] == "done" and g,
                   15, "done after a resend")
    # RQ_COUNT is the pool's deliveries before this one
    assert got["status"] == "second run, count 1"


def test_a_bad_message_in_the_stream_does_not_stop_the_queue(
        solo: LocalNats, pool_queue: Callable[..., DaemonProcess]) -> None:
    # Given a pool queue, and something that is not an rqsys message in its stream
    pq = pool_queue("p5")
    publish_raw(solo.url, "rq.pool.p5", b'{"no": "id"}')
    # When a good message follows, it runs; the bad one was dropped, with the reason
    msg_id = pq.call("create", msg={"dest": "pq", "param1": "good"})["msg_id"]
    wait_for(lambda: pq.call("get", msg_id=msg_id)["state"] == "done", 15, "the good one")
    assert pq.proc.poll() is None
    assert "a message that cannot be taken is dropped from the pool: KeyError" in (
        pq.stderr_text())


def test_a_message_this_host_cannot_take_goes_back_to_the_pool(
        layout: Layout, pool_queue: Callable[..., DaemonProcess]) -> None:
    # Given a pool message whose staging here will fail (a file where its
    # directory goes: the mkdir fails, as on a full disk)
    pq = pool_queue("p8", num_workers=1)
    pause_pulls(pq)
    msg_id = pq.call("create", msg={"dest": "pq", "param1": "kept"})["msg_id"]
    blocker = layout.queue_dir("pq") / TMP_DIR / f"{msg_id}.que"
    blocker.write_text("in the way")
    # When the host takes it
    pq.call("adminoper", oper="up")
    wait_for(lambda: "pool: cannot take a message here" in pq.stderr_text(), 15, "the failure")
    # Then it went back to the pool, not out of it (it was terminated: never run
    # anywhere, and a worker slot kept for it for good), and runs once it can be taken
    blocker.unlink()
    got = wait_for(lambda: (g := pq.call("get", msg_id=msg_id))["state"] == "done" and g,
                   15, "run after all")
    assert got["status"].startswith("ran kept count ")
    others = [pq.call("create", msg={"dest": "pq", "param1": f"m{n}"})["msg_id"] for n in range(3)]
    for other in others:  # its worker slot is free again (one: it was kept for good)
        wait_for(lambda i=other: pq.call("get", msg_id=i)["state"] == "done", 15, "the rest")


def publish_raw(url: str, subject: str, data: bytes) -> None:
    import asyncio

    import nats

    async def send() -> None:
        nc = await nats.connect(url)
        await nc.jetstream().publish(subject, data)
        await nc.close()

    asyncio.run(send())


def test_rq_pools_shows_the_pool(solo: LocalNats, layout: Layout,
                                 make_queue: Callable[..., Path],
                                 daemon: Callable[..., DaemonProcess]) -> None:
    use_nats(layout, solo.url)
    make_queue("pq", OK, pool={"name": "p6", "replicas": 1})
    make_queue("plain", OK)
    pq = daemon("pq")
    msg_id = pq.call("create", msg={"dest": "pq"})["msg_id"]
    wait_for(lambda: pq.call("get", msg_id=msg_id)["state"] == "done", 15, "done")
    # The ack follows the end once it is flushed: until then the stream counts it in flight
    wait_for(lambda: pq.call("pool")["in_flight"] == 0, 15, "the end acked")
    got = subprocess.run([str(Path(sys.executable).parent / "rq"), "--root", str(layout.root),
                          "pools"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    first, line = got.stdout.splitlines()
    assert first == "ok 1 pool queue(s)"
    assert line.startswith("p6 (queue pq, host 1 127.0.0.1): depth 0, not yet delivered 0, "
                           "in flight 0 (here 0), redelivered 0")
    assert line.endswith("; in flight per host: 127.0.0.1 0")


def test_messages_queued_before_the_pool_go_to_the_pool(
        solo: LocalNats, layout: Layout, make_queue: Callable[..., Path],
        daemon: Callable[..., DaemonProcess]) -> None:
    # Given a queue with messages queued while it was a plain queue
    from rqsys.store import QueueStore

    use_nats(layout, solo.url)
    make_queue("pq", OK, pool={"name": "p8", "replicas": 1})
    store = QueueStore(layout.queue_dir("pq"))
    ids = [store.create({"dest": "pq", "param1": f"old{n}", "count": 0, "due": 0})
           for n in range(3)]
    store.flush(force=True)
    # When its daemon starts as a pool queue, they are handed to the pool and run once
    pq = daemon("pq")
    for n, msg_id in enumerate(ids):
        got = wait_for(lambda i=msg_id: (g := pq.call("get", msg_id=i))["state"] == "done"
                       and g, 15, f"{msg_id} done")
        assert got["status"] == f"ran old{n} count 0"
    assert pq.stderr_text().count("queued here at start: handed to the pool") == 3


def test_a_pulled_message_back_in_que_at_a_restart_is_not_published_again(
        tmp_path: Path, pool_queue: Callable[..., DaemonProcess],
        daemon: Callable[..., DaemonProcess]) -> None:
    gate = tmp_path / "gate"
    # Given a pool message pulled and running here when the daemon stops: it goes
    # back to this host's que/, and the stream still has it (naked)
    pq = pool_queue("p10", f'while [ ! -e {gate} ]; do sleep 0.05; done\n'
                           'echo "done ran $RQ_PARAM1" >&3\n')
    msg_id = pq.call("create", msg={"dest": "pq", "param1": "once"})["msg_id"]
    wait_for(lambda: pq.call("get", msg_id=msg_id)["state"] == "run", 15, "it running")
    pq.stop()
    gate.touch()
    # When the daemon starts again
    pq = daemon("pq")
    # Then its local copy is only removed (published again, it was a second message
    # once JetStream's 10 minutes of duplicate ids had passed, and ran twice), and
    # the stream's delivers it again: it runs once more, here
    wait_for(lambda: "handed to the pool, in the pool already" in pq.stderr_text(), 15,
             "the hand-back")
    got = wait_for(lambda: (g := pq.call("get", msg_id=msg_id))["state"] == "done" and g,
                   30, "run after the restart")
    assert got["status"] == "ran once"
    assert "handed to the pool, published" not in pq.stderr_text()


MD5_OF_A = 'echo "done $(md5sum < ../attach/a | cut -c1-32)" >&3\n'


def tamper(url: str, bucket: str, name: str, data: bytes | None, how: str = "put") -> None:
    """Replace an object of a pool's object store with ``data``, delete it (None),
    or (``how="corrupt"``) add ``data`` to its chunks: its SHA-256 no longer holds."""
    import asyncio

    import nats

    async def change() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        obs = await js.object_store(bucket)
        if data is None:
            await obs.delete(name)
        elif how == "corrupt":
            await js.publish(f"$O.{bucket}.C.{(await obs.get_info(name)).nuid}", data)
        else:
            await obs.put(name, data)
        await nc.close()

    asyncio.run(change())


def test_attachments_travel_through_the_object_store(
        solo: LocalNats, pool_queue: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    import hashlib

    from rqsys.errors import BadRequest

    pq = pool_queue("p9", MD5_OF_A)
    data = tmp_path / "a"
    data.write_bytes(bytes(range(256)) * 1500)  # 384 kB: several chunks
    md5 = hashlib.md5(data.read_bytes()).hexdigest()

    def send(sent_md5: str = md5) -> str:
        with open(data, "rb") as f, pq.client() as client:
            reply = client.call("create", fds=[f.fileno()], msg={"dest": "pq"},
                                attachments=[{"name": "a", "md5": sent_md5}])
        return str(reply["msg_id"])

    # A file whose md5 is not the one sent is refused, naming it
    with pytest.raises(BadRequest, match="attachment a: md5 mismatch"):
        send("0" * 32)
    # A message with an attachment runs with the same bytes
    msg_id = send()
    got = wait_for(lambda: (g := pq.call("get", msg_id=msg_id))["state"] == "done" and g,
                   20, "done")
    assert got["status"] == md5 and got["attachments"]["a"]["md5"] == md5
    # A prep message (RQ's HTTP way to attach) is made here with a pool id, and
    # goes to the pool with its attachment at commit; a second commit says so
    prep = pq.call("create", msg={"dest": "pq"}, state="prep")["msg_id"]
    assert host_of(prep) == 1
    with open(data, "rb") as f, pq.client() as client:
        client.call("attach", fds=[f.fileno()], msg_id=prep, name="a", md5=md5)
    assert pq.call("commit", msg_id=prep)["url"].endswith(prep)
    got = wait_for(lambda: (g := pq.call("get", msg_id=prep))["state"] == "done" and g,
                   20, "prep committed, done")
    assert got["status"] == md5
    assert pq.call("commit", msg_id=prep)["already"] == "done"
    # A missing or replaced object ends its message with the reason; it never runs
    pause_pulls(pq)
    gone, changed, corrupt = send(), send(), send()
    tamper(solo.url, "rq-pool-p9", f"{gone}/a", None)
    tamper(solo.url, "rq-pool-p9", f"{changed}/a", b"another file")
    tamper(solo.url, "rq-pool-p9", f"{corrupt}/a", b"garbage", how="corrupt")
    pq.call("adminoper", oper="resume")
    for msg_id, why in ((gone, "not in the pool's object store"),
                        (changed, f"not the file sent \\(md5 sent {md5}, got "),
                        (corrupt, "corrupted in the pool's object store \\(SHA-256")):
        got = wait_for(lambda i=msg_id: (g := pq.call("get", msg_id=i))["state"] == "err"
                       and g, 20, f"{msg_id} refused")
        assert re.match(f"not run: attachment a: {why}", got["status"]), got["status"]
    counts = pq.call("counts")["counts"]
    assert counts["done"] == 2 and counts["err"] == 3  # in this host's err/, unrun


def test_the_documented_nats_config_is_valid(tmp_path: Path) -> None:
    # The cluster config docs/SCALING.md gives for Debian's nats-server, as nats-server reads it
    need(nats_available(), "nats-server (Debian package nats-server)")
    doc = (REPO / "docs" / "SCALING.md").read_text()
    conf = doc.split("```\n", 2)[1].split("```", 1)[0]
    assert 'server_name: "a"' in conf and "routes:" in conf
    path = tmp_path / "nats-server.conf"
    path.write_text(conf.replace("/var/lib/nats", str(tmp_path / "js")))
    got = subprocess.run(["nats-server", "-t", "-c", str(path)], capture_output=True,
                         text=True, timeout=30)
    assert got.returncode == 0, got.stderr + got.stdout
