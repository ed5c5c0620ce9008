"""The verdict after a power cut: is every acknowledged message on disk, once, intact?

It reads the disk as an operator would (``queue/<q>/<state>/[<shard>/]<id>/``),
not through the store's code, and compares it with the acknowledgements the
clients reported (``acks/*.jsonl``) and with the ``done`` set the previous
check saw:

- *lost*: an acknowledged message in no state; a message a check saw in
  ``done`` (or ``relayed``) that is no longer there; a relayed message with no
  committed copy at the far end.
- *corrupted*: found, but its ``msg`` is unreadable or differs from what was
  sent, an acknowledged attachment is missing or has another MD5, a
  committed message is still in ``prep``, or it is in two states at once.

A lost message is looked for in ``.tmp/`` and ``lost+found/`` to say where
it went.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATES = ("prep", "que", "run", "done", "err", "relayed")
SHARDED = ("done", "relayed")
ENDED = {"pc": "done", "pc2": "done", "relay": "relayed"}
RELAY_SOURCE = "http://127.0.0.1:{port}/q/relay/{id}"


@dataclass
class Expected:
    """What the acknowledgements promise about one message."""

    queue: str
    msg_id: str
    msg: dict[str, Any]
    committed: bool
    last_op: str
    attach: dict[str, str] = field(default_factory=dict)


def read_acks(ack_dir: Path) -> tuple[dict[tuple[str, str], Expected], int]:
    """Fold every ack line into expectations; a line the cut tore is skipped."""
    expected: dict[tuple[str, str], Expected] = {}
    torn = 0
    for path in sorted(ack_dir.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                torn += 1
                continue
            _fold(expected, rec)
    return expected, torn


def _fold(expected: dict[tuple[str, str], Expected], rec: dict[str, Any]) -> None:
    key = (rec["q"], rec["id"])
    if rec["op"] in ("create", "prep"):
        expected[key] = Expected(rec["q"], rec["id"], rec["msg"], rec["op"] == "create",
                                 rec["op"])
        return
    exp = expected[key]
    exp.last_op = rec["op"]
    if rec["op"] == "attach":
        exp.attach[rec["name"]] = rec["md5"]
    elif rec["op"] == "commit":
        exp.committed = True


def scan_queue(qdir: Path) -> dict[str, list[tuple[str, Path]]]:
    """id -> [(state, its directory)] for every message of a queue."""
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


def read_msg(mdir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((mdir / "msg").read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def md5_of(path: Path) -> str | None:
    try:
        return hashlib.md5(path.read_bytes()).hexdigest()
    except OSError:
        return None


def verify(exp: Expected, places: list[tuple[str, Path]]) -> str:
    """Why a message found on disk is not intact ("" when it is)."""
    if len(places) > 1:
        return f"in {len(places)} states: {', '.join(s for s, _ in places)}"
    state, mdir = places[0]
    if exp.committed and state == "prep":
        return "commit acknowledged, still in prep"
    return _msg_differs(exp.msg, read_msg(mdir)) or _attach_differs(exp.attach, mdir)


def _msg_differs(sent: dict[str, Any], stored: dict[str, Any] | None) -> str:
    if stored is None:
        return "msg unreadable"
    bad = [k for k, v in sent.items() if stored.get(k) != v]
    return f"msg fields differ: {', '.join(bad)}" if bad else ""


def _attach_differs(attach: dict[str, str], mdir: Path) -> str:
    for name, md5 in attach.items():
        got = md5_of(mdir / "attach" / name)
        if got != md5:
            return f"attachment {name}: " + ("missing" if got is None else f"MD5 {got}")
    return ""


class Check:
    """One check of a root against the acknowledgements and the last done set."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.disk = {q: scan_queue(root / "queue" / q) for q in ENDED}
        self.lost: list[dict[str, Any]] = []
        self.corrupted: list[dict[str, Any]] = []

    def messages(self, expected: dict[tuple[str, str], Expected]) -> None:
        for (queue, msg_id), exp in expected.items():
            places = self.disk[queue].get(msg_id, [])
            if not places:
                self.lost.append({"q": queue, "id": msg_id, "last_op": exp.last_op,
                                  "why": "in no state", "where": self.trace(queue, msg_id)})
                continue
            why = verify(exp, places)
            if why:
                self.corrupted.append({"q": queue, "id": msg_id, "why": why,
                                       "last_op": exp.last_op})

    def done_set(self) -> dict[str, list[str]]:
        """Ids now in each queue's final state (the next check expects them there)."""
        return {q: sorted(i for i, places in self.disk[q].items()
                          if any(s == ENDED[q] for s, _ in places)) for q in ENDED}

    def ended_kept(self, previous: dict[str, list[str]]) -> None:
        """A message seen ended by an earlier check (after a clean stop) stays so."""
        now = self.done_set()
        for queue, ids in previous.items():
            for msg_id in sorted(set(ids) - set(now[queue])):
                places = [s for s, _ in self.disk[queue].get(msg_id, [])]
                self.lost.append({"q": queue, "id": msg_id, "last_op": ENDED[queue],
                                  "why": f"was {ENDED[queue]}, now in {places or 'no state'}",
                                  "where": self.trace(queue, msg_id)})

    def relay_copies(self, expected: dict[tuple[str, str], Expected]) -> list[dict[str, Any]]:
        """Each relayed message has exactly one committed copy in pc2, intact."""
        copies: dict[str, list[Path]] = {}
        for places in self.disk["pc2"].values():
            for state, mdir in places:
                msg = read_msg(mdir) if state != "prep" else None
                if msg and msg.get("orig_msg_id"):
                    copies.setdefault(str(msg["orig_msg_id"]), []).append(mdir)
        dups = []
        for (queue, msg_id), exp in expected.items():
            places = self.disk[queue].get(msg_id, []) if queue == "relay" else []
            if [s for s, _ in places] != ["relayed"]:
                continue
            found = copies.get(RELAY_SOURCE.format(port=self.port, id=msg_id), [])
            self._relay_copy(exp, found, dups)
        return dups

    def _relay_copy(self, exp: Expected, found: list[Path], dups: list[dict[str, Any]]) -> None:
        ident = {"q": "pc2", "id": exp.msg_id, "last_op": "relayed"}
        if not found:
            self.lost.append({**ident, "why": "relayed, no copy in pc2", "where": ""})
            return
        if len(found) > 1:
            dups.append({**ident, "copies": [str(p) for p in found]})
        sent = {k: v for k, v in exp.msg.items() if k.startswith("param")}
        why = _msg_differs(sent, read_msg(found[0])) or _attach_differs(exp.attach, found[0])
        if why:
            self.corrupted.append({**ident, "why": f"far copy: {why}"})

    def trace(self, queue: str, msg_id: str) -> str:
        """Where a lost message's directory went, if anywhere."""
        tmp = self.root / "queue" / queue / ".tmp"
        hits = [f".tmp/{p.name}" for p in _listdir(tmp) if p.name.startswith(msg_id)]
        for base in (tmp, self.root.parent / "lost+found"):
            hits += [str(p) for p in _listdir(base) if _holds(p, msg_id)]
        return "; ".join(hits)


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _holds(path: Path, msg_id: str) -> bool:
    msg = read_msg(path)
    return bool(msg and msg.get("msg_id") == msg_id)


def check_run(chan: Path, root: Path, boot: int, port: int) -> dict[str, Any]:
    """Check ``root`` against every acknowledgement so far; the result as JSON data."""
    expected, torn = read_acks(chan / "acks")
    check = Check(root, port)
    check.messages(expected)
    check.ended_kept(_previous_done(chan, boot))
    dups = check.relay_copies(expected)
    return {"boot": boot, "acked": len(expected), "torn_lines": torn, "lost": check.lost,
            "corrupted": check.corrupted, "relay_duplicates": dups,
            "done": check.done_set(),
            "states": {q: _state_counts(check.disk[q]) for q in ENDED}}


def _previous_done(chan: Path, boot: int) -> dict[str, list[str]]:
    for prev in range(boot - 1, -1, -1):
        path = chan / f"check.{prev}.json"
        if path.exists():
            return dict(json.loads(path.read_text())["done"])
    return {}


def _state_counts(found: dict[str, list[tuple[str, Path]]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for places in found.values():
        for state, _ in places:
            counts[state] = counts.get(state, 0) + 1
    return counts
