"""The crash-point workload: a queue, the client's operations, and what each acknowledged.

Two phases share one queue script (the cleaner's are in ``cp_prune``, the
relay's in ``cp_relay``):

- ``ops``: a fresh queue's daemon takes creates over the socket (one with an
  attachment, four at once for a group commit), a prep message with an
  attach and a commit, a delete in prep and one in que (while paused), then
  drains them (run, done, err, resend) and is stopped cleanly.
- ``recovery``: a daemon is killed (SIGKILL) with two scripts running, a
  message queued and a prep message holding an attachment; the daemon that
  is killed at a crash point is the *next* one, whose start recovers that.

Every answer the client got is folded into :class:`Acks`; the first failure
to reach the daemon ends the workload (it was killed).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqsys.errors import NotFound, Unavailable
from rqsys.scan.scandir import install_queue
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

QUEUE = "cp"
SCRIPT = """#!/bin/bash
case "$RQ_PARAM1" in
  err) echo "err failed on purpose" >&3 ;;
  resend) if [ "$RQ_COUNT" -lt 2 ]; then echo "resend 0-once more" >&3
          else echo "done after a resend" >&3; fi ;;
  slow) echo "run waiting for the gate" >&3
        while [ ! -e "$GATE" ]; do sleep 0.05; done; echo "done gate open" >&3 ;;
  *) echo "run working" >&3; echo "done $RQ_PARAM2" >&3 ;;
esac
"""
ENDED = ("done", "err", "relayed", "gone")
FINAL = {"err": "err"}  # param1 -> the state a committed message ends in; else done
DRAIN_TIMEOUT = 30.0
ROUNDS = 3


@dataclass
class Expected:
    """What the answers promise about one message."""

    msg: dict[str, str]
    attach: dict[str, str] = field(default_factory=dict)  # name -> MD5
    committed: bool = True
    deleted: bool = False
    asked: set[str] = field(default_factory=set)  # commit/delete sent, maybe unanswered
    ends_in: str = ""  # the state it ends in, when not the script's word (relayed)

    @property
    def final(self) -> str:
        return self.ends_in or FINAL.get(self.msg.get("param1", ""), "done")


@dataclass
class Acks:
    """Everything the client was told, to be checked after the restart."""

    messages: dict[str, Expected] = field(default_factory=dict)
    done_seen: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def created(self, msg_id: str, exp: Expected) -> None:
        with self.lock:
            self.messages[msg_id] = exp


class Killed(Exception):
    """The daemon is gone: the workload stops here."""


def make_root(root: Path) -> Layout:
    """A state root with the crash-point queue installed."""
    layout = Layout(root, root / "sock")
    layout.make_dirs()
    layout.socket_dir.mkdir()
    entry = root / "scripts" / QUEUE
    entry.mkdir(parents=True)
    (entry / "run").write_text(SCRIPT)
    (entry / "run").chmod(0o755)
    config = {"num_workers": 3, "env_vars": {"GATE": str(root / "gate")}}
    (entry / "config.json").write_text(json.dumps(config))
    install_queue(layout, QUEUE, entry)
    return layout


class Client:
    """Calls that turn a vanished daemon into :class:`Killed`."""

    def __init__(self, layout: Layout, acks: Acks, data_dir: Path, queue: str = QUEUE) -> None:
        self.layout, self.acks, self.data_dir, self.queue = layout, acks, data_dir, queue
        self.conn = QueueClient(layout, queue, timeout=15.0)

    def call(self, op: str, fds: list[int] | tuple[int, ...] = (), **args: Any) -> dict[str, Any]:
        try:
            return self.conn.call(op, fds=fds, **args)
        except Unavailable as exc:
            raise Killed(str(exc)) from exc

    def create(self, param1: str, tag: str, state: str = "que",
               files: dict[str, bytes] | None = None, **fields: str) -> str:
        msg = {"param1": param1, "param2": tag, "param3": "x" * 300, **fields}
        specs, fds = self._open(files or {})
        try:
            extra = {"attachments": specs} if specs else {}
            reply = self.call("create", fds=fds, msg=msg, state=state, **extra)
        finally:
            for fd in fds:
                os.close(fd)
        msg_id = str(reply["msg_id"])
        self.acks.created(msg_id, Expected(msg, {s["name"]: s["md5"] for s in specs},
                                           committed=state == "que",
                                           ends_in="relayed" if "dest" in fields else ""))
        return msg_id

    def attach(self, msg_id: str, name: str, data: bytes) -> None:
        specs, fds = self._open({name: data})
        try:
            self.call("attach", fds=fds, msg_id=msg_id, name=name, md5=specs[0]["md5"])
        finally:
            os.close(fds[0])
        self.acks.messages[msg_id].attach[name] = specs[0]["md5"]

    def commit(self, msg_id: str) -> None:
        self.acks.messages[msg_id].asked.add("commit")
        self.call("commit", msg_id=msg_id)
        self.acks.messages[msg_id].committed = True

    def delete(self, msg_id: str) -> None:
        self.acks.messages[msg_id].asked.add("delete")
        self.call("delete", msg_id=msg_id)
        self.acks.messages[msg_id].deleted = True

    def _open(self, files: dict[str, bytes]) -> tuple[list[dict[str, str]], list[int]]:
        specs, fds = [], []
        for name, data in files.items():
            path = self.data_dir / f"{name}.{time.monotonic_ns()}"
            path.write_bytes(data)
            specs.append({"name": name, "md5": hashlib.md5(data).hexdigest()})
            fds.append(os.open(path, os.O_RDONLY))
        return specs, fds


def ops_phase(client: Client) -> None:
    """ROUNDS of creates, prep-attach-commit and deletes, while the queue drains."""
    for k in range(ROUNDS):
        one_round(client, k)
    wait_final(client)


def one_round(client: Client, k: int) -> None:
    """Creates (plain, attached, grouped), prep-attach-commit, deletes."""
    for param1 in ("done", "err", "resend"):
        client.create(param1, f"plain-{param1}-{k}")
    client.create("done", f"attached-{k}", files={"data.bin": os.urandom(3000)})
    group_commit(client, 4, k)
    prep = client.create("done", f"prep-{k}", state="prep")
    client.attach(prep, "late.bin", os.urandom(2000))
    client.commit(prep)
    client.delete(client.create("done", f"deleted-prep-{k}", state="prep"))
    client.call("adminoper", oper="pause")
    client.delete(client.create("done", f"deleted-que-{k}"))
    client.call("adminoper", oper="resume")


def group_commit(client: Client, n: int, k: int) -> None:
    """n creates on n connections at once (the daemon syncs them as one group)."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def one(j: int) -> None:
        other = Client(client.layout, client.acks, client.data_dir, client.queue)
        try:
            barrier.wait(10)
            other.create("done", f"group-{k}-{j}")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            errors.append(exc)
        finally:
            other.conn.close()

    threads = [threading.Thread(target=one, args=(j,)) for j in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def recovery_setup(client: Client) -> None:
    """Two scripts running (waiting for the gate), one queued, one prep with a file."""
    client.create("slow", "slow-1")
    client.create("slow", "slow-2")
    client.create("done", "queued")
    prep = client.create("done", "prep-kept", state="prep")
    client.attach(prep, "kept.bin", os.urandom(1500))
    deadline = time.monotonic() + 15
    while client.call("counts")["counts"].get("run", 0) < 2:
        if time.monotonic() > deadline:
            raise AssertionError("the slow scripts did not start")
        time.sleep(0.02)


def wait_final(client: Client, timeout: float = DRAIN_TIMEOUT) -> None:
    """Until every acknowledged, committed, kept message has ended; notes those in done.

    The states are asked only once the queue counts nothing queued or running
    (one call, not one per message, while scripts run)."""
    deadline = time.monotonic() + timeout
    waiting = _waiting(client.acks)
    while waiting:
        if time.monotonic() > deadline:
            raise AssertionError(f"not ended within {timeout}s: {sorted(waiting)}")
        if any(client.call("counts")["counts"].get(s, 0) for s in ("que", "run")):
            time.sleep(0.03)
            continue
        for msg_id in list(waiting):
            try:
                state = client.call("state", msg_id=msg_id)["state"]
            except NotFound:  # the checker says whether it may be gone
                state = "gone"
            if state in ENDED:
                waiting.discard(msg_id)
                if state == "done":
                    client.acks.done_seen.add(msg_id)
        time.sleep(0.03 if waiting else 0)


def _waiting(acks: Acks) -> set[str]:
    return {i for i, e in acks.messages.items() if e.committed and "delete" not in e.asked}


def run_workload(layout: Layout, acks: Acks, work: Callable[[Client], None],
                 queue: str = QUEUE) -> bool:
    """Run ``work``; False when the daemon vanished on the way."""
    data_dir = layout.root / "client-data"
    data_dir.mkdir(exist_ok=True)
    client = Client(layout, acks, data_dir, queue)
    try:
        work(client)
    except Killed:
        return False
    finally:
        client.conn.close()
    return True


def wait_counts(client: Client, states: tuple[str, ...], timeout: float = DRAIN_TIMEOUT) -> None:
    """Until the daemon counts no message in ``states``."""
    deadline = time.monotonic() + timeout
    while any(client.call("counts")["counts"].get(s, 0) for s in states):
        if time.monotonic() > deadline:
            raise AssertionError(f"messages still in {'/'.join(states)} after {timeout}s")
        time.sleep(0.02)
