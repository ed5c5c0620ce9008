"""The verdict after a crash point: is every acknowledged message on disk, once, intact?

It reads the queue directory as an operator would
(``<state>/[<shard>/]<id>/{msg,attach/}``), not through the store's code:

- *lost*: an acknowledged (and not deleted) message in no state, or one the
  client saw in ``done`` that is no longer there;
- *corrupted*: in two states at once; its ``msg`` unreadable or not what was
  sent; an acknowledged attachment missing or with another MD5; committed
  but still in ``prep``; ended in another state than its script says; an
  acknowledged delete that came back.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cp_scenario import Acks, Expected

STATES = ("prep", "que", "run", "done", "err", "relayed")
SHARDED = ("done", "relayed")


@dataclass
class Verdict:
    """Lost and corrupted messages, each with the reason."""

    lost: list[str] = field(default_factory=list)
    corrupted: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.corrupted


def scan(qdir: Path) -> dict[str, list[tuple[str, Path]]]:
    """id -> [(state, its directory)] for every message of the queue."""
    found: dict[str, list[tuple[str, Path]]] = {}
    for state in STATES:
        for path in _message_dirs(qdir / state, state in SHARDED):
            found.setdefault(path.name, []).append((state, path))
    return found


def _message_dirs(base: Path, sharded: bool) -> list[Path]:
    if not base.is_dir():
        return []
    dirs = [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")]
    if sharded:
        return [m for shard in dirs for m in shard.iterdir() if m.is_dir()]
    return dirs


def check(qdir: Path, acks: Acks) -> Verdict:
    """Compare the queue directory with everything the client was told."""
    verdict = Verdict()
    found = scan(qdir)
    for msg_id, places in found.items():
        if len(places) > 1:
            verdict.corrupted.append(f"{msg_id}: in {', '.join(s for s, _ in places)}")
    for msg_id, exp in acks.messages.items():
        places = found.get(msg_id, [])
        if exp.deleted:
            if places:
                verdict.corrupted.append(f"{msg_id}: deleted, back in {places[0][0]}")
        elif not places and "delete" not in exp.asked:
            verdict.lost.append(f"{msg_id} ({exp.msg.get('param2')}): in no state")
        elif len(places) == 1 and (why := _differs(exp, *places[0])):
            verdict.corrupted.append(f"{msg_id} ({exp.msg.get('param2')}): {why}")
    for msg_id in sorted(acks.done_seen):
        states = [s for s, _ in found.get(msg_id, [])]
        if "done" not in states:
            verdict.lost.append(f"{msg_id}: was done, now in {states or 'no state'}")
    return verdict


def _differs(exp: Expected, state: str, mdir: Path) -> str:
    """Why one message found on disk is not what was acknowledged ("" if it is)."""
    stored = _read_msg(mdir)
    if stored is None:
        return f"msg unreadable in {state}"
    bad = [k for k, v in exp.msg.items() if stored.get(k) != v]
    if bad:
        return f"msg fields differ in {state}: {', '.join(bad)}"
    for name, md5 in exp.attach.items():
        got = _md5(mdir / "attach" / name)
        if got != md5:
            return f"attachment {name}: " + ("missing" if got is None else f"MD5 {got}")
    return _wrong_state(exp, state)


def _wrong_state(exp: Expected, state: str) -> str:
    """A committed message has ended as its script says; an uncommitted one waits
    in prep (or has ended, if a commit was sent but not answered)."""
    if exp.committed:
        return "" if state == exp.final else f"ended in {state}, its script says {exp.final}"
    allowed = ("prep", exp.final) if "commit" in exp.asked else ("prep",)
    return "" if state in allowed else f"not committed, yet in {state}"


def _read_msg(mdir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((mdir / "msg").read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _md5(path: Path) -> str | None:
    try:
        return hashlib.md5(path.read_bytes()).hexdigest()
    except OSError:
        return None
