"""Pool queues on one nats-server: what a pool queue holds in its KV bucket
(unique keys, ``single``), clones and a script's dup to its own queue through
the pool with their files, and what a pool queue refuses."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats_util
import pytest
from conftest import DaemonProcess, wait_for
from nats_util import LocalNats, pause_pulls

from rqsys.pool.ids import PoolIds, host_of

solo = nats_util.solo  # the fixture (one nats-server on loopback)
pool_queue = nats_util.pool_queue  # the fixture (a pool queue on it)


def test_a_pool_queue_refuses_what_it_cannot_do(pool_queue: Callable[..., DaemonProcess]) -> None:
    pq = pool_queue("p7")
    for args, refused in (
            ({"single": True, "msg": {"dest": "pq", "unique_key": "k"}},
             "queue pq is a pool queue \\(p7\\): single and unique_key together"),
            ({"msg": {"dest": "pq", "unique_key": "k"}, "state": "prep"},
             "unique_key: not taken by a pool queue's prep messages")):
        with pytest.raises(Exception, match=refused):
            pq.call("create", **{"msg": {"dest": "pq"}, **args})


def unique_entry(url: str, bucket: str, msg: dict[str, Any]) -> dict[str, Any] | None:
    """The pool's bucket entry of a message's unique key (None: not held)."""
    import asyncio

    import nats
    from nats.js.errors import KeyNotFoundError

    from rqsys.pool.unique import kv_key

    async def get() -> dict[str, Any] | None:
        nc = await nats.connect(url)
        try:
            entry = await (await nc.jetstream().key_value(bucket)).get(kv_key(msg))
            return dict(json.loads(entry.value))
        except KeyNotFoundError:
            return None
        finally:
            await nc.close()

    return asyncio.run(get())


def test_unique_keys_are_held_in_the_pool(
        solo: LocalNats, pool_queue: Callable[..., DaemonProcess]) -> None:
    pq = pool_queue("p10")
    # Given a message holding key k in the pool (waiting: the queue is paused)
    pause_pulls(pq)
    msg = {"dest": "pq", "unique_key": "k"}
    first = pq.call("create", msg=msg)
    assert unique_entry(solo.url, "rq-pool-p10", msg) == {"id": first["msg_id"], "until": None}
    # When another create names k while it is queued or running: the holder, nothing new
    again = pq.call("create", msg={"dest": "pq", "unique_key": "k"})
    assert again == {**first, "duplicate": True}
    assert "duplicate" not in pq.call("create", msg={"dest": "pq", "unique_key": "other"})
    # Once it has ended, k is free: the next create is a new message
    pq.call("adminoper", oper="resume")
    wait_for(lambda: pq.call("get", msg_id=first["msg_id"])["state"] == "done", 15, "done")
    wait_for(lambda: unique_entry(solo.url, "rq-pool-p10", msg) is None, 10, "k let go")
    assert "duplicate" not in pq.call("create", msg=msg)
    # And with unique_for, the key stays held that long after the end, then is taken over
    held = {"dest": "pq", "unique_key": "w", "unique_for": 3}
    holder = pq.call("create", msg=held)["msg_id"]
    got = wait_for(lambda: (e := unique_entry(solo.url, "rq-pool-p10", held)) and e["until"]
                   and e, 15, "w held for 3 s after its end")
    assert got["id"] == holder
    again = pq.call("create", msg=held)["msg_id"]
    assert again == holder or time.time() >= got["until"]  # (a slow machine: window over)
    later = wait_for(lambda: "duplicate" not in (g := pq.call("create", msg=held)) and g,
                     10, "w free after 3 s")
    assert later["msg_id"] != holder
    # the key is the new message's now (with an "until" once it has run: the queue is not paused)
    assert unique_entry(solo.url, "rq-pool-p10", held)["id"] == later["msg_id"]


def test_single_is_held_in_the_pool_while_queued(pool_queue: Callable[..., DaemonProcess]) -> None:
    pq = pool_queue("p12")
    # Given a single message queued in the pool (the queue paused: nobody takes it)
    pause_pulls(pq)
    first = pq.call("create", msg={"dest": "pq", "param1": "x"}, single=True)
    # When another single create has the same params: that message, nothing new
    assert pq.call("create", msg={"dest": "pq", "param1": "x"}, single=True) == first
    # (other params, or not single: new messages)
    assert pq.call("create", msg={"dest": "pq", "param1": "y"}, single=True) != first
    assert pq.call("create", msg={"dest": "pq", "param1": "x"})["msg_id"] != first["msg_id"]
    # Once a host has taken it, it is no longer queued: the next single one is new
    pq.call("adminoper", oper="resume")
    wait_for(lambda: pq.call("get", msg_id=first["msg_id"])["state"] == "done", 15, "done")
    later = wait_for(lambda: (g := pq.call("create", msg={"dest": "pq", "param1": "x"},
                                           single=True))["msg_id"] != first["msg_id"] and g,
                     10, "a new single message once the first was taken")
    assert "duplicate" not in later


DUP_ONCE = """if [ -z "$RQ_ORIG_MSG_ID" ] && [ "$RQ_PARAM1" = dup ]; then
  echo "dup 0-x-pq" >&$RQ_WRITE; read -r -u $RQ_READ answer; echo "done dup $answer" >&3; exit 0
fi
echo "done $(md5sum < ../attach/a | cut -c1-32) from $RQ_ORIG_MSG_ID" >&3
"""


def test_clones_and_dups_go_to_the_pool_with_their_files(
        pool_queue: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    import hashlib

    from rqsys.errors import NotFound

    pq = pool_queue("p11", DUP_ONCE)
    data = tmp_path / "a"
    data.write_bytes(b"attached " * 1000)
    md5 = hashlib.md5(data.read_bytes()).hexdigest()
    # Given a message whose script dups it to its own (pool) queue
    with open(data, "rb") as f, pq.client() as client:
        first = client.call("create", fds=[f.fileno()], msg={"dest": "pq", "param1": "dup"},
                            attachments=[{"name": "a", "md5": md5}])

    def done(msg_id: str) -> str:
        return str(wait_for(lambda: (g := pq.call("get", msg_id=msg_id))["state"] == "done"
                            and g["status"], 20, f"{msg_id} done"))

    # Then the dup is a new pool message, run with the same file
    answer = done(first["msg_id"])
    assert answer.startswith("dup ok "), answer
    dup_id = answer.rsplit("/", 1)[1]
    assert host_of(dup_id) == 1 and done(dup_id) == f"{md5} from {first['url']}"
    # And a clone of it goes to the pool the same way
    clone = pq.call("clone", msg_id=first["msg_id"])
    assert clone["msg_id"] not in (first["msg_id"], dup_id)
    assert done(clone["msg_id"]) == f"{md5} from {first['url']}"
    # And a message this host does not hold cannot be cloned here, saying where
    with pytest.raises(NotFound, match="clones a message on the host that holds it"):
        pq.call("clone", msg_id=PoolIds(2).next_id())
