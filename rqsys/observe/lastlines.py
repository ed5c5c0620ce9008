"""The last lines a failed run wrote, kept beside its status: why it failed, without its log.

When a run ends in err (a bad exit, a signal, a timeout, or the script's own
``err``), the daemon reads the end of its ``job/stdio.log`` (at most
``WINDOW`` bytes) and keeps the last ``KEEP`` lines that are not blank in the
message's ``lastlines`` file, as a terminal would have shown them: escape
sequences dropped, a line rewritten by ``\\r`` as its last rewrite.  RQ's
status text stays exactly as RQ writes it; the message JSON has these as
``last_lines``, and the failure groups key an improper exit on the last one
(``rqsys.observe.failures``), so ``ValueError: bad row 7`` and ``KeyError:
'x'`` are two groups, not one "PROCESS EXITED IMPROPERLY".  The file is
advisory (not synced): a power cut can lose it, never the message.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rqsys.store.layout import LAST_LINES

FILE = LAST_LINES
KEEP = 20  # lines kept (the last failure's)
PER_RUN = 5  # lines of each failed attempt kept in its timeline (``last_lines`` of its end)
LOG_AT = "log_at"  # msg field: where in job/stdio.log the next run's output begins
WINDOW = 16384  # bytes read from the end of the output
MAX_LINE = 500  # characters of one kept line
# CSI, OSC (ended by BEL or ST, or cut off), a charset choice, the other two-byte escapes
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
                     r"|\x1b[()*+].?|\x1b[@-Z\\-_]?")
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def from_output(data: bytes, cut: bool = False) -> list[str]:
    """The last ``KEEP`` lines of output that are not blank (``cut``: ``data``
    starts mid-file, so its first line is a piece and is dropped)."""
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if cut and len(lines) > 1:
        lines = lines[1:]
    kept: list[str] = []
    for line in reversed(lines):
        shown = _as_shown(line)
        if shown:
            kept.append(shown[:MAX_LINE])
            if len(kept) == KEEP:
                break
    return kept[::-1]


def _as_shown(line: str) -> str:
    """One line as a terminal leaves it: the text after its last ``\\r``
    that is not blank, escapes and other controls dropped."""
    line = ESCAPES.sub("", line)
    parts = [CONTROLS.sub("", part).rstrip() for part in line.split("\r")]
    return next((part for part in reversed(parts) if part.strip()), "")


def of_log(path: str) -> list[str]:
    """The last lines of a run's log ([] when it has none)."""
    return of_run(path, 0)[0]


def of_run(path: str, since: int) -> tuple[list[str], int]:
    """The last lines the log holds after byte ``since`` (where one run's
    output began: the runs of a message share its log), and the log's size."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return [], 0
    try:
        size = os.fstat(fd).st_size
        since = since if 0 <= since <= size else 0  # a log cut short meanwhile: all of it
        start = max(since, size - WINDOW)
        data = os.pread(fd, size - start, start)
    except OSError:
        return [], 0
    finally:
        os.close(fd)
    return from_output(data, cut=start > since), size


def encode(lines: list[str]) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


def read(msg_dir: Path | str) -> list[str]:
    """A message's kept lines ([] when none were kept)."""
    try:
        text = Path(msg_dir, FILE).read_text("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError):
        return []
    return text.split("\n")[:-1]  # as written: \n ends each (not splitlines: U+2028 is text)


def read_at(dfd: int, msg_id: str) -> str:
    """The last kept line of ``msg_id`` in the state directory ``dfd`` ("" when none)."""
    try:
        fd = os.open(f"{msg_id}/{FILE}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return ""
    try:
        data = os.read(fd, (MAX_LINE + 1) * 4 * KEEP)
    except OSError:
        return ""
    finally:
        os.close(fd)
    lines = data.decode("utf-8", "replace").split("\n")[:-1]
    return lines[-1] if lines else ""
