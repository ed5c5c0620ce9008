"""The web app in process on a fake of its daemon connections, for the web's unit tests.

``create_app`` takes its ``Connections``; ``FakeDaemons`` stands in for
them: it answers each op from a table (an exception is raised) and records
every call, so a test asserts what the web asked, or that it asked nothing.
The users are ``basic_auth`` accounts of each role, hashed with argon2 at
its cheapest parameters (a real hash, checked in microseconds: the default
costs a quarter second per app).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, NamedTuple

import argon2
import falcon.testing
import pytest

from rqsys import config
from rqsys.store import Layout
from rqsys.web.app import create_app

HOST = "h.example"  # the config's host: the name in message URLs
MID = "20260101.1200.00.001"  # a message id of RQ's form
# user -> (role, queues); "old" is a config from before roles: a bare hash, an admin
USERS: dict[str, tuple[str | None, list[str] | None]] = {
    "vic": ("viewer", None), "olga": ("operator", ["etl-*"]), "ann": ("admin", None),
    "old": (None, None)}
QUEUES = ("billing", "etl-1", "etl-2")
_HASHER = argon2.PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)


def password(user: str) -> str:
    return f"pw-{user}"


def users_config() -> dict[str, Any]:
    users: dict[str, Any] = {}
    for user, (role, queues) in USERS.items():
        hashed = _HASHER.hash(password(user))
        users[user] = hashed if role is None else {
            "password": hashed, "role": role, **({"queues": queues} if queues else {})}
    return {"realm": "rq", "users": users}


def basic(user: str, secret: str | None = None) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{secret or password(user)}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


class FakeDaemons:
    """``Connections.call`` answered from ``answers`` (op -> a dict, an exception
    to raise, or a function of the args), each call recorded as (queue, op, args)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}
        self.reset()

    def reset(self) -> FakeDaemons:
        """No calls yet, and the usual answers (for the next test on the same app)."""
        self.calls.clear()
        self.answers.clear()
        self.answers.update({
            "create": {"msg_id": MID},
            "state": {"state": "que"},
            "list": {"ids": [MID], "total": 1},
            "search": {"rows": [], "total": 0, "more": False, "partial": False},
            "counts": {"admin": "UP", "status": "", "num_workers": 1, "uptime": 5,
                       "counts": {"que": 1}},
            "adminoper": {"admin": "PAUSE"},
            "delete": {}, "cancel": {}, "commit": {},
        })
        return self

    def call(self, queue: str, op: str, fds: Any = (), **args: Any) -> dict[str, Any]:
        self.calls.append((queue, op, args))
        answer = self.answers.get(op, {})
        if isinstance(answer, Exception):
            raise answer
        return dict(answer(**args) if callable(answer) else answer)

    def ops(self) -> list[tuple[str, str]]:
        return [(queue, op) for queue, op, _args in self.calls]


def make_layout(layout: Layout, **cfg: Any) -> None:
    """The queues of QUEUES (a directory and its config.json is all the web
    looks for: not ``create_queue_dir``, whose fsyncs cost 10 ms a queue) and
    the system's config.json."""
    for name in QUEUES:
        layout.queue_dir(name).mkdir(parents=True)
        (layout.queue_dir(name) / "config.json").write_text(json.dumps({"name": name}))
    layout.config_file.write_text(json.dumps({"host": HOST, "port": 3333, **cfg}))


def client(layout: Layout, daemons: FakeDaemons) -> falcon.testing.TestClient:
    """The real app on ``daemons``, asked as a local browser would name it (Host);
    its audit records go to its file only (no journald, whatever the environment)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("JOURNAL_STREAM", raising=False)
        app = create_app(layout, config.load_system_config(layout), connections=daemons)
    return falcon.testing.TestClient(app, headers={"Host": "localhost"})


class Served(NamedTuple):
    """One app for a test module (the web keeps no state a test would see but
    its audit file): the layout, the fake daemons (``reset`` per test), the client."""

    layout: Layout
    daemons: FakeDaemons
    client: falcon.testing.TestClient


def served(root: Path, **cfg: Any) -> Served:
    layout = Layout(root, root / "sock")
    layout.make_dirs()
    make_layout(layout, **cfg)
    daemons = FakeDaemons()
    return Served(layout, daemons, client(layout, daemons))
