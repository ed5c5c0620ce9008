"""A backup's manifest (format, messages, files) and the check that a backup is whole.

A backup is a directory holding ``root/`` (a state root's shape: the
messages in the states they were copied in, the root's other files) and
``manifest.json``, written durably after everything else is on disk: a
backup without one did not finish.  Each message is a row ``[queue, state,
id, md5 of msg, entries, bytes]``; every other file ``path: [size, md5]``
(a symbolic link ``path: ["->", target]``).  :func:`check_whole` compares a
backup's ``root/`` with them before a restore takes anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rqsys import __version__
from rqsys.backup import files
from rqsys.errors import RQError
from rqsys.store import durable, formats
from rqsys.store.layout import STATES, TMP_DIR
from rqsys.store.view import QueueView, listdir

NAME = "manifest.json"
TREE = "root"  # the copy of the root, beside the manifest
KIND = "rqsys backup"
MESSAGE_DIRS = (*STATES, TMP_DIR)  # under queue/<q>/: messages, not "files"
Row = list[Any]  # [queue, state, id, md5 of msg, entries, bytes]


class BackupError(RQError):
    """A backup or a restore that cannot be made, or a backup that is not whole."""


def message_row(queue: str, state: str, msg_id: str, copy: Path) -> Row:
    """The manifest's row of one message, from its copy."""
    msg = copy / "msg"
    md5 = files.file_md5(msg) if msg.is_file() else ""
    return [queue, state, msg_id, md5, *files.summary(copy)]


def write(dest: Path, began: float, ended: float, fmt: int, root: Path,
          rows: list[Row]) -> dict[str, Any]:
    """Describe the copy in ``dest/root`` and write the manifest, durably (last)."""
    data = {"kind": KIND, "format": fmt, "by": f"rqsys {__version__}", "root": str(root),
            "began": round(began, 3), "ended": round(ended, 3),
            "messages": sorted(rows), "files": other_files(dest / TREE)}
    durable.write_file_durably(dest / NAME, json.dumps(data, indent=1).encode() + b"\n")
    return data


def other_files(tree: Path) -> dict[str, list[Any]]:
    """Every file of a backup's ``root/`` outside the messages, described."""
    return {rel: files.describe(tree / rel) for rel in files.tree_files(tree)
            if not _in_messages(rel)}


def _in_messages(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) > 3 and parts[0] == "queue" and parts[2] in MESSAGE_DIRS


def read(src: Path) -> dict[str, Any]:
    """A backup's manifest; BackupError when it has none or it is unreadable."""
    try:
        data = json.loads((src / NAME).read_bytes())
    except FileNotFoundError:
        raise BackupError(f"{src} has no {NAME}: not a backup, or one that did not "
                          "finish") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"{src / NAME}: unreadable ({exc}): the backup is damaged") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or \
            not isinstance(data.get("format"), int) or not isinstance(data.get("messages"), list):
        raise BackupError(f"{src / NAME}: not an rqsys backup's manifest")
    return data


def check_format(src: Path, data: dict[str, Any]) -> None:
    """FormatError for a backup in a format newer than this rqsys knows."""
    if data["format"] > formats.FORMAT:
        raise formats.FormatError(
            f"the backup {src} is in on-disk format {data['format']}, newer than this rqsys "
            f"({__version__}) knows (format {formats.FORMAT}): restore it with the rqsys "
            "that made it, or a newer one")


def check_whole(src: Path, data: dict[str, Any]) -> None:
    """BackupError naming what differs between the backup and its manifest."""
    tree = src / TREE
    listed = {tuple(row[:3]): row for row in data["messages"]}
    there = _messages_in(tree)
    wrong = [f"message {'/'.join(key)} missing" for key in sorted(set(listed) - set(there))]
    wrong += [f"message {'/'.join(key)} not in the manifest"
              for key in sorted(set(there) - set(listed))]
    wrong += [f"message {'/'.join(key)} differs (msg md5, entries, bytes)"
              for key in sorted(set(listed) & set(there))
              if listed[key] != message_row(key[0], key[1], key[2], there[key])]
    found = other_files(tree)
    expected = data.get("files", {})
    wrong += [f"file {rel} missing" for rel in sorted(set(expected) - set(found))]
    wrong += [f"file {rel} not in the manifest" for rel in sorted(set(found) - set(expected))]
    wrong += [f"file {rel} differs" for rel in sorted(set(found) & set(expected))
              if found[rel] != expected[rel]]
    if wrong:
        raise BackupError(f"the backup {src} is not whole ({len(wrong)} differences from its "
                          f"manifest; the first: {wrong[0]}): nothing restored")


def _messages_in(tree: Path) -> dict[tuple[str, str, str], Path]:
    """Every message directory of a backup's ``root/``, by (queue, state, id)."""
    found = {}
    for queue in listdir(tree / "queue"):
        view = QueueView(tree / "queue" / queue)
        for state in STATES:
            for msg_id in view.ids(state):
                found[(queue, state, msg_id)] = view.msg_dir(state, msg_id)
    return found
