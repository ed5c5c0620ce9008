"""Unit tests of the relay hand-over (rqsys.run.handoff) against a real
listening Unix socket standing in for the relay worker: a run it drops
makes the message's next run start the script, and what it remembers so is
bounded by the messages still in the queue."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from rqsys.fdclose import close_fds
from rqsys.run.handoff import LOST, HandedChild, HandOff
from rqsys.web import msgpage


class Env:
    """The queue's shared run environment, as RunEnvironment gives it."""

    def __init__(self, path: str) -> None:
        self._shared = {"RQ_RELAY_SOCKET": path}

    def shared(self) -> dict[str, str]:
        return self._shared


@pytest.fixture
def worker(tmp_path: Path) -> Any:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "relay.sock"))
    listener.listen(8)
    listener.settimeout(10)
    yield listener
    listener.close()


def dropped_run(handoff: HandOff, worker: socket.socket, job: Path, msg_id: str) -> None:
    """A run handed over that the worker drops (it closes without ``exit N``)."""
    child = handoff.start("/usr/lib/rqsys/rqrelay", {"RQ_MSG_ID": msg_id}, str(job), None)
    assert isinstance(child, HandedChild)
    conn, _ = worker.accept()
    conn.close()
    assert child.wait()[1] == LOST and child.lost
    close_fds(child.release())


def test_a_dropped_run_is_remembered_only_while_its_message_is_here(worker, tmp_path):
    here = {"a", "b"}
    handoff = HandOff(Env(worker.getsockname()), here.__contains__)  # type: ignore[arg-type]
    dropped_run(handoff, worker, tmp_path / "a", "a")
    assert handoff.again == {"a"}
    # When a is deleted (or moved, or ends elsewhere) before it runs again
    here.discard("a")
    # Then the next dropped run lets it go: the set holds only messages still here
    dropped_run(handoff, worker, tmp_path / "b", "b")
    assert handoff.again == {"b"}
    # And b's next run starts the script (None), which lets it go
    assert handoff.start("/x/rqrelay", {"RQ_MSG_ID": "b"}, str(tmp_path / "b"), None) is None
    assert handoff.again == set()


def test_the_web_runs_table_names_the_relay_worker_of_a_handed_run():
    started = {"ev": "started", "t": 1.0, "run": 1, "host": "a", "handed": "relay worker"}
    assert msgpage.runs([started])[0]["where"] == "a / relay worker"
