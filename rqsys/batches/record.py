"""A batch's directory: its spec, its members, their ends, and its callback.

``batches/<id>/`` holds, each file with one writer:

- ``batch.json``: the spec (total, ``on_done``, ``on_err``, members per
  queue), durable before any member is made;
- ``members.<queue>``: the ids made in that queue, one a line (the creator);
- ``sealed``: every member is made (the creator, before it answers);
- ``failed``: why making it failed (its members made so far were deleted);
- ``ended.<queue>``: one line per member that ended there, written by that
  queue's daemon: the id and done | err | relayed | gone, padded to
  ``LINE`` bytes so that a file's size counts its lines (a line twice, after
  a crash, is counted once when it matters: :func:`progress`);
- ``callback``: the callback's URL (or ``none``) once it is made.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqsys.store import durable

LINE = 64  # bytes of an ``ended`` line, padded
ENDS = ("done", "err", "relayed", "gone")
BATCH_ID_RE = re.compile(r"^b\d{8}\.\d{6}\.[0-9a-f]{8}$")


def new_id() -> str:
    import secrets  # here: it brings hashlib, which a queue daemon's start does without

    return f"b{time.strftime('%Y%m%d.%H%M%S', time.gmtime())}.{secrets.token_hex(4)}"


def ended_line(msg_id: str, state: str) -> bytes:
    return f"{msg_id} {state}".ljust(LINE - 1).encode() + b"\n"


@dataclass
class Progress:
    """What a batch's files say now."""

    spec: dict[str, Any]
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENDS, 0))
    sealed: bool = False
    failed: str = ""
    callback: str | None = None

    @property
    def ended(self) -> int:
        return sum(self.counts.values())

    @property
    def complete(self) -> bool:
        return self.sealed and self.ended >= int(self.spec["total"])

    def report(self) -> dict[str, Any]:
        total = int(self.spec["total"])
        return {"id": self.spec["id"], "created": self.spec["created"], "total": total,
                "queues": self.spec["queues"], "counts": self.counts, "ended": self.ended,
                "pending": max(total - self.ended, 0), "sealed": self.sealed,
                "failed": self.failed or None, "complete": self.complete,
                "callback": self.callback, "on_done": self.spec.get("on_done"),
                "on_err": self.spec.get("on_err")}


def write_spec(path: Path, spec: dict[str, Any]) -> None:
    durable.write_file_durably(path / "batch.json", json.dumps(spec).encode())


def read_spec(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "batch.json").read_text()))


def add_members(path: Path, queue: str, ids: list[str]) -> None:
    durable.append_durably(path / f"members.{queue}", "".join(f"{i}\n" for i in ids).encode())


def members(path: Path, queue: str) -> list[str]:
    try:
        return (path / f"members.{queue}").read_text().split()
    except FileNotFoundError:
        return []


def mark(path: Path, name: str, text: str) -> None:
    """``sealed``, ``failed`` or ``callback``."""
    durable.write_file_durably(path / name, (text + "\n").encode())


def read_mark(path: Path, name: str) -> str | None:
    try:
        return (path / name).read_text().strip()
    except FileNotFoundError:
        return None


def add_ended(path: Path, queue: str, ends: list[tuple[str, str]]) -> None:
    """Member ends in ``queue`` (its daemon alone writes this file)."""
    durable.append_durably(path / f"ended.{queue}",
                           b"".join(ended_line(i, state) for i, state in ends))


def ended_here(path: Path, queue: str) -> set[str]:
    return {line.split()[0] for line in _lines(path / f"ended.{queue}")}


def ended_estimate(path: Path) -> int:
    """Lines in all ``ended`` files, from their sizes (a stat each)."""
    return sum(entry.stat().st_size // LINE for entry in os.scandir(path)
               if entry.name.startswith("ended."))


def progress(path: Path) -> Progress:
    """The batch's spec and its members' ends, each member counted once."""
    found = Progress(read_spec(path))
    made = {i for queue in found.spec["queues"] for i in members(path, queue)}
    states: dict[str, str] = {}
    for entry in os.scandir(path):
        if entry.name.startswith("ended."):
            for line in _lines(Path(entry.path)):
                words = line.split()  # a torn line is not taken, nor an id not made here
                if len(words) == 2 and words[1] in ENDS and words[0] in made:
                    states[words[0]] = words[1]
    for state in states.values():
        found.counts[state] += 1
    found.sealed = read_mark(path, "sealed") is not None
    found.failed = read_mark(path, "failed") or ""
    found.callback = read_mark(path, "callback")
    return found


def _lines(path: Path) -> list[str]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return [line.decode("utf-8", "replace") for line in data.split(b"\n")
            if len(line) == LINE - 1]
