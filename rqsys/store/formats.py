"""The state root's on-disk format: its version, written at the first start, and its migrations.

``<root>/format.json`` says ``{"format": N, "by": "rqsys X"}``.  Every
program that opens a root for writing (``rqsys serve``, a queue daemon, the
web, rq-scan) calls :func:`ensure` first, under an exclusive ``flock`` of
``<root>/.format.lock``, so that one of them migrates and the others wait
for it and then find the root current:

* no ``format.json`` in a root that holds no queue: a new root, stamped
  with this version;
* no ``format.json`` in a root that holds queues: a root every rqsys before
  formats made (format 0), migrated;
* an older version: each step from it to :data:`FORMAT` in turn;
* a newer version: :class:`FormatError`, one line naming both versions,
  and the program exits without touching anything.

A step is idempotent (it may run again over its own half-done work) and
safe to cut off at any point: the version is written after the step has
finished, durably, so a power cut in the middle leaves the older version
on disk and the next start runs the step again.  Only the version file
says which format a root is in; no step reads another's leftovers as a
version.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from rqsys import __version__
from rqsys.errors import RQError
from rqsys.store import durable

FORMAT = 1  # this rqsys's on-disk format
EXIT_NEWER = 78  # EX_CONFIG: the units' RestartPreventExitStatus= (no restart loop on it)
FILE = "format.json"
LOCK = ".format.lock"
QUEUES = "queue"  # the root's queues (``Layout.queues``): their presence makes a root old


class FormatError(RQError):
    """The root's format cannot be used by this rqsys (newer, or unreadable)."""


def _format_1(root: Path) -> None:
    """0 -> 1: the layout every rqsys before formats wrote is format 1's as it
    is (messages, timelines, stats, audit, batches): nothing to rewrite; the
    version is what it adds (a root now says what wrote it)."""


# STEPS[n] takes a root from format n to n + 1.
STEPS: dict[int, Callable[[Path], None]] = {0: _format_1}


def read(root: Path) -> int | None:
    """The root's format version; None when it has no ``format.json``."""
    try:
        data = json.loads((root / FILE).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FormatError(f"{root / FILE}: cannot be read ({exc}); it says which on-disk "
                          "format the state root is in") from None
    value = data.get("format") if isinstance(data, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FormatError(f"{root / FILE}: no format version in it ({str(data)[:80]})")
    return value


def ensure(root: Path, say: Callable[[str], None] | None = None) -> int:
    """Make ``root``'s format this rqsys's (stamp a new root, migrate an older
    one); FormatError for a newer one.  Returns the version found before."""
    root.mkdir(parents=True, exist_ok=True)
    if read(root) == FORMAT:
        return FORMAT  # current: nothing to take the lock for (the usual start)
    fd = os.open(root / LOCK, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)  # any user may lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another program of this root migrating: wait
        return _ensure_locked(root, say or (lambda _text: None))
    finally:
        os.close(fd)


def _ensure_locked(root: Path, say: Callable[[str], None]) -> int:
    found = read(root)
    if found is None:
        found = 0 if _holds_queues(root) else FORMAT
    if found > FORMAT:
        raise FormatError(f"the state root {root} is in on-disk format {found}, newer than "
                          f"this rqsys ({__version__}) knows (format {FORMAT}): run the "
                          "rqsys that wrote it, or a newer one")
    if found < FORMAT:
        say(f"state root {root}: on-disk format {found}, migrating to {FORMAT}")
    for version in range(found, FORMAT):
        STEPS[version](root)
        write(root, version + 1)
    if read(root) is None:  # a new root (or one of format 0 with no steps run)
        write(root, FORMAT)
    for left in root.glob(f".{FILE}.*.tmp"):  # a version's write cut off before its rename
        left.unlink(missing_ok=True)
    return found


def write(root: Path, version: int) -> None:
    """Say durably that ``root`` is in format ``version``."""
    data = json.dumps({"format": version, "by": f"rqsys {__version__}"}).encode() + b"\n"
    durable.write_file_durably(root / FILE, data)


def _holds_queues(root: Path) -> bool:
    try:
        return any(entry.is_dir() for entry in os.scandir(root / QUEUES))
    except FileNotFoundError:
        return False
