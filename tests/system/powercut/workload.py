#!/usr/bin/env python3
"""A client in the guest: creates messages and reports each acknowledgement before the next.

Roles (one process each): ``burst`` creates messages in ``pc`` in bursts
with pauses between them (so that cuts fall in bursts and in drains);
``attach`` makes a prep message, attaches files (some copied from tmpfs, some
hard-linked from the same disk) and commits it, or now and then leaves it in
prep; ``relay`` sends messages, some with attachments, through the ``relay``
queue to ``pc2`` by URL (``force_remote``: the same rqsys over HTTP).

Every acknowledged step is one line of JSON written with one ``write(2)`` to
the role's file on the host's channel directory (shared over 9p without a
guest cache: QEMU writes it on the host before ``write`` returns) before the
next request is sent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from rqsys.errors import RQError
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

TEXT = "abcdefghijklmnopqrstuvwxyz0123456789 -_.:/é€"
PARAM_SIZES = (0, 8, 200, 900, 1500, 4000)  # around a spare's 1024-byte blank msg
ATTACH_SIZES = (0, 1, 700, 5000, 70_000, 300_000)
SLEEPS_MS = (0, 0, 0, 0, 10, 50, 200)  # most drain at once, some while the cut comes


class Reporter:
    """Appends one JSON line per acknowledgement, one write each."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def ack(self, **record: Any) -> None:
        os.write(self.fd, (json.dumps(record) + "\n").encode())


class Client:
    """One role's loop; errors (a daemon restarting) are logged and retried."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.rng = random.Random(args.seed)
        self.layout = Layout.from_root(args.root)
        self.report = Reporter(args.acks)
        self.scratch = Path(args.scratch)
        self.scratch.mkdir(exist_ok=True)
        self.relay_dest = f"http://127.0.0.1:{args.port}/q/pc2"
        self.role = args.role
        self.seq = 0

    def text(self) -> str:
        return "".join(self.rng.choice(TEXT) for _ in range(self.rng.choice(PARAM_SIZES)))

    def new_msg(self, dest: str) -> dict[str, Any]:
        self.seq += 1
        return {"dest": dest, "param1": f"{self.role}-{os.getpid()}-{self.seq}",
                "param2": str(self.rng.choice(SLEEPS_MS)), "param3": self.text(),
                "param4": self.text()}

    def run(self) -> None:
        step = {"burst": self.burst, "attach": self.attach_flow, "relay": self.relay}[self.role]
        while True:
            try:
                step()
            except (RQError, OSError) as exc:
                print(f"{self.role}: {type(exc).__name__}: {exc}", flush=True)
                time.sleep(0.2)

    # -- roles -------------------------------------------------------------------
    def burst(self) -> None:
        with QueueClient(self.layout, "pc") as client:
            for _ in range(self.rng.choice((1, 5, 20, 60))):
                self.create(client, "pc", self.new_msg("pc"))
        time.sleep(self.rng.uniform(0.0, 0.4))

    def attach_flow(self) -> None:
        with QueueClient(self.layout, "pc") as client:
            msg_id = self.create(client, "pc", self.new_msg("pc"), state="prep")
            for n in range(self.rng.randint(1, 3)):
                self.attach(client, "pc", msg_id, f"file{n}.bin")
            if self.rng.random() < 0.9:  # else abandoned in prep: it must stay there
                client.call("commit", msg_id=msg_id)
                self.report.ack(op="commit", q="pc", id=msg_id)

    def relay(self) -> None:
        msg = dict(self.new_msg(self.relay_dest), force_remote=True)
        with QueueClient(self.layout, "relay") as client:
            if self.rng.random() < 0.5:
                self.create(client, "relay", msg)
                return
            msg_id = self.create(client, "relay", msg, state="prep")
            self.attach(client, "relay", msg_id, "payload.bin")
            client.call("commit", msg_id=msg_id)
            self.report.ack(op="commit", q="relay", id=msg_id)
        time.sleep(self.rng.uniform(0.0, 0.2))

    # -- steps ---------------------------------------------------------------------
    def create(self, client: QueueClient, queue: str, msg: dict[str, Any],
               state: str = "que") -> str:
        reply = client.call("create", msg=msg, state=state)
        msg_id = str(reply["msg_id"])
        self.report.ack(op="prep" if state == "prep" else "create", q=queue, id=msg_id, msg=msg)
        return msg_id

    def attach(self, client: QueueClient, queue: str, msg_id: str, name: str) -> None:
        data = self.rng.randbytes(self.rng.choice(ATTACH_SIZES))
        # on the same disk the daemon hard-links the file; from tmpfs it copies it
        where = self.scratch if self.rng.random() < 0.5 else Path(tempfile.gettempdir())
        # A new name every time (O_EXCL): the daemon hard-links the file, and
        # a name whose unlink a cut undid would otherwise be opened and
        # truncated again by a later client (pids repeat from boot to boot),
        # rewriting a stored attachment through its other name.
        fd, name_on_disk = tempfile.mkstemp(prefix=f"{name}.", dir=where)
        path = Path(name_on_disk)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        md5 = hashlib.md5(data).hexdigest()
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            client.call("attach", fds=[fd], msg_id=msg_id, md5=md5, name=name)
        finally:
            os.close(fd)
            path.unlink()
        self.report.ack(op="attach", q=queue, id=msg_id, name=name, md5=md5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", required=True, choices=("burst", "attach", "relay"))
    for name in ("root", "acks", "scratch"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=3333)
    Client(parser.parse_args()).run()


if __name__ == "__main__":
    main()
