"""The queue-script pipe grammar (RQ's), as pure parsing.

A script writes lines ``CMD SP TEXT NL`` on fd 3 (RQ_WRITE)::

    run TEXT            progress, shown as the message status (``N%`` or
                        ``N/M`` at its start: how far along, ``progress``)
    done TEXT           success (the script must also exit 0)
    err TEXT            failure; the message goes to err whatever the exit
    relayed URL         the relay script delivered the message to URL
    resend SECS-TEXT    back to que, due SECS seconds from now
    dup DUE-X-DEST      copy this message to DEST (a queue or an http(s) URL),
                        answered on fd 4 with ``ok <id>`` or ``fail <why>``
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rqsys.errors import ProtocolError

TERMINAL = frozenset({"done", "err", "relayed", "resend"})
COMMANDS = frozenset({"run", "dup"}) | TERMINAL
MAX_TEXT = 4096  # status text kept per line; the rest is cut, never the command

MAX_DELAY = 10 * 366 * 86400  # seconds a resend or dup may wait: ten years


@dataclass(frozen=True)
class Command:
    """One parsed line from a queue script."""

    kind: str
    text: str = ""
    due: int = 0
    dest: str = ""

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL


def parse_line(raw: bytes) -> Command:
    """Parse one line (without its newline); ProtocolError says what is wrong."""
    line = raw.decode("utf-8", "replace").rstrip("\r")
    kind, _, text = line.partition(" ")
    if kind not in COMMANDS:
        raise ProtocolError(f"unknown command {kind[:40]!r}")
    text = text[:MAX_TEXT]
    if kind == "resend":
        return _parse_resend(text)
    if kind == "dup":
        return _parse_dup(text)
    if kind == "relayed" and not text.strip():
        raise ProtocolError("relayed needs the new message URL")
    return Command(kind, text)


def _parse_delay(word: str, line: str) -> int:
    # ASCII digits only: str.isdigit() also accepts '²' and '①', which int() refuses.
    if not (word.isascii() and word.isdigit()):
        raise ProtocolError(f"bad delay {word[:40]!r} in {line[:80]!r}")
    if len(word) > len(str(MAX_DELAY)) or int(word) > MAX_DELAY:
        raise ProtocolError(f"delay {word[:40]!r} is over {MAX_DELAY} s in {line[:80]!r}")
    return int(word)


def _parse_resend(text: str) -> Command:
    secs, _, reason = text.partition("-")
    return Command("resend", reason, due=_parse_delay(secs.strip(), text))


def _parse_dup(text: str) -> Command:
    parts = text.split("-", 2)
    if len(parts) != 3 or not parts[2].strip():
        raise ProtocolError(f"dup needs DUE-X-DEST, got {text[:80]!r}")
    due, _flag, dest = parts
    return Command("dup", text, due=_parse_delay(due.strip(), text), dest=dest.strip())


PROGRESS = re.compile(r"\s*(?:(\d{1,3}(?:\.\d+)?)\s*%|(\d+)\s*/\s*(\d+)(?![\d.]))")


def progress(text: str) -> dict[str, float] | None:
    """How far along a ``run`` text says it is: ``N%`` or ``N/M`` at its start
    (``{"fraction": 0..1}``, with ``done`` and ``total`` for ``N/M``); None
    when it says nothing of it (or nonsense: over 100 %, a total of 0)."""
    found = PROGRESS.match(text)
    if found is None:
        return None
    percent, done, total = found.groups()
    if percent is not None:
        value = float(percent)
        return {"fraction": round(value / 100, 4)} if value <= 100 else None
    if int(total) == 0 or int(done) > int(total):
        return None
    return {"fraction": round(int(done) / int(total), 4), "done": int(done),
            "total": int(total)}
