"""The cleaner queue, run for real: old done/relayed go, acknowledged errs go, nothing else.

Messages reach done, relayed and err through a real queue daemon and script;
their end times are then forged into the past with ``os.utime``; a message to
the real ``cleaner`` queue (our cleaner.py) asks the queue's daemon to prune.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, wait_for

from rqsys import config
from rqsys.errors import BadRequest
from rqsys.special import install_special_queues
from rqsys.store import Layout, QueueStore

DAY = 86400
SCRIPT = """
case "$RQ_PARAM1" in
  fail) echo "err boom" >&3 ;;
  relay) echo "relayed http://10.213.1.99:3333/q/x/20260101.0000.00.000.0" >&3 ;;
  hold) while [ ! -e "$RQ_PARAM2" ]; do sleep 0.05; done; echo "done held" >&3 ;;
  *) echo "done ok" >&3 ;;
esac
"""


def send(d: Any, **msg: Any) -> str:
    return str(d.call("create", msg={"dest": d.name, **msg}, **msg.pop("_extra", {}))["msg_id"])


def wait_state(d: Any, msg_id: str, state: str) -> dict[str, Any]:
    return wait_for(lambda: (got := d.call("get", msg_id=msg_id))["state"] == state and got,
                    15, f"{msg_id} in {state}")


def age(store: QueueStore, state: str, msg_id: str, days: float) -> None:
    """Forge the time a message ended (its directory and status file)."""
    when = time.time() - days * DAY
    mdir = store.msg_dir(state, msg_id)
    for path in (mdir, mdir / "status"):
        if path.exists():
            os.utime(path, (when, when))


@pytest.fixture
def queues(layout: Layout, make_queue: Any, daemon: Any, tmp_path: Path) -> Any:
    install_special_queues(layout)
    make_queue("work", SCRIPT, num_workers=4)
    return daemon("work"), daemon("cleaner")


def clean(cleaner: Any, **params: str) -> dict[str, Any]:
    msg_id = send(cleaner, **params)
    return wait_for(lambda: (got := cleaner.call("get", msg_id=msg_id))["state"] in ("done", "err")
                    and got, 30, "the cleaner's verdict")


def test_prunes_old_done_relayed_and_acked_err_only(queues: Any, layout: Layout,
                                                    tmp_path: Path) -> None:
    work, cleaner = queues
    store = QueueStore(layout.queue_dir("work"))
    # Given done, relayed and err messages, some of them ended long ago
    done = [send(work) for _ in range(4)]
    relayed = [send(work, param1="relay") for _ in range(2)]
    errs = [send(work, param1="fail") for _ in range(3)]
    for msg_id in done:
        wait_state(work, msg_id, "done")
    for msg_id in relayed:
        wait_state(work, msg_id, "relayed")
    for msg_id in errs:
        wait_state(work, msg_id, "err")
    for msg_id in done:  # a whole hourly shard of old ones
        age(store, "done", msg_id, 10)
    age(store, "relayed", relayed[0], 4)  # old; relayed[1] is recent
    age(store, "relayed", relayed[1], 2)
    (store.msg_dir("err", errs[0]) / "ack").write_text("seen\n")  # acknowledged
    for msg_id in errs:
        age(store, "err", msg_id, 30)  # old, but not acknowledged: kept
    # ... and old messages in prep, que and run, which must never be touched
    prep = str(work.call("create", msg={"dest": "work"}, state="prep")["msg_id"])
    later = send(work, due=time.time() + 3600)
    gate = tmp_path / "gate"
    running = send(work, param1="hold", param2=str(gate))
    wait_state(work, running, "run")
    for state, msg_id in (("prep", prep), ("que", later), ("run", running)):
        age(store, state, msg_id, 100)
    # When the cleaner runs for queue work with 3 days
    got = clean(cleaner, param1="3", param2="work")
    # Then exactly the old done/relayed and the acknowledged err are gone
    assert got["state"] == "done", got["status"]
    assert "removed 6 message(s)" in got["status"]
    assert list(store.ids("done")) == []
    assert list(store.ids("relayed")) == [relayed[1]]
    assert sorted(store.ids("err")) == sorted(errs[1:])
    for state, msg_id in (("prep", prep), ("que", later), ("run", running)):
        assert store.find(msg_id) == state
    counts = work.call("counts")["counts"]
    assert (counts["done"], counts["relayed"], counts["err"]) == (0, 1, 2)
    # And the daemon still works on: the held message finishes into done
    gate.write_text("go")
    wait_state(work, running, "done")
    assert work.call("counts")["counts"]["done"] == 1


def test_all_queues_and_default_days(queues: Any, layout: Layout, daemon: Any) -> None:
    work, cleaner = queues
    daemon("relay"), daemon("webhook")
    store = QueueStore(layout.queue_dir("work"))
    old, young = send(work), send(work)
    wait_state(work, old, "done")
    wait_state(work, young, "done")
    age(store, "done", old, 3.5)
    age(store, "done", young, 2.5)
    got = clean(cleaner)  # no params: 3 days, every queue
    assert got["state"] == "done", got["status"]
    assert list(store.ids("done")) == [young]
    assert "from 4 queue(s)" in got["status"]  # work + relay, webhook, cleaner


@pytest.mark.parametrize("params, why", [
    ({"param1": "abc"}, "param1 (days) must be a number"),
    ({"param1": "-1"}, "param1 (days) must be 0 or more"),
    ({"param1": "nan"}, "param1 (days) must be 0 or more"),
    ({"param2": "nosuch"}, "param2: no queue named nosuch"),
    ({"param2": "../etc"}, "invalid queue name"),
    ({"param3": "soon"}, "param3 (prep days) must be a number"),
    ({"param3": "-2"}, "param3 (prep days) must be 0 or more"),
])
def test_bad_params_are_err_with_reason(queues: Any, layout: Layout, params: dict[str, str],
                                        why: str) -> None:
    work, cleaner = queues
    done = send(work)
    wait_state(work, done, "done")
    age(QueueStore(layout.queue_dir("work")), "done", done, 10)
    got = clean(cleaner, **params)
    assert got["state"] == "err" and why in got["status"]
    assert QueueStore(layout.queue_dir("work")).find(done) == "done"  # nothing removed


@pytest.mark.parametrize("days", ["x", -1, None, float("nan")])
def test_prune_op_refuses_bad_days(queues: Any, days: Any) -> None:
    work, _cleaner = queues
    with pytest.raises(BadRequest):
        work.call("prune", days=days)
    with pytest.raises(BadRequest):
        work.call("prune", days=3, prep_days=days if days is not None else [])


def test_param3_prunes_prep_messages_untouched_that_long(queues: Any, layout: Layout,
                                                          tmp_path: Path) -> None:
    work, cleaner = queues
    store = QueueStore(layout.queue_dir("work"))
    # Given three prep messages: one abandoned 10 days ago, one made 10 days
    # ago but given an attachment today, one made today
    abandoned, attached, fresh = (
        str(work.call("create", msg={"dest": "work"}, state="prep")["msg_id"]) for _ in range(3))
    data = tmp_path / "data.bin"
    data.write_bytes(b"attached today")
    for msg_id in (abandoned, attached):
        forge_mtime(store.msg_dir("prep", msg_id), 10)
        forge_mtime(store.msg_dir("prep", msg_id) / "msg", 10)
    with open(data, "rb") as f:
        work.call("attach", fds=[f.fileno()], msg_id=attached, name="data.bin",
                  md5=hashlib.md5(b"attached today").hexdigest())
    # When the cleaner runs with param3 = 7 days
    got = clean(cleaner, param1="3", param2="work", param3="7")
    # Then only the abandoned one is gone, and the queue's count says so
    assert got["state"] == "done", got["status"]
    assert "removed 1 message(s)" in got["status"]
    assert sorted(store.ids("prep")) == sorted([attached, fresh])
    assert work.call("counts")["counts"]["prep"] == 2
    # And without param3 no prep message is touched, however old
    forge_mtime(store.msg_dir("prep", fresh), 100)
    forge_mtime(store.msg_dir("prep", fresh) / "msg", 100)
    assert clean(cleaner, param1="0", param2="work")["state"] == "done"
    assert sorted(store.ids("prep")) == sorted([attached, fresh])


def forge_mtime(path: Path, days: float) -> None:
    when = time.time() - days * DAY
    os.utime(path, (when, when))


def test_daily_timer_example_is_valid() -> None:
    path = REPO / "scandir-examples" / ".timers" / "cleaner.json"
    timer = config.validate("timer", json.loads(path.read_text()), str(path))
    assert timer["period"] == DAY and timer["msg"]["dest"] == "cleaner"
