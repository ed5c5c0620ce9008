"""A queue's user under systemd: its unit's drop-in, and its directory handed to that user.

A queue with ``"user": NAME`` gets a drop-in of ``rq@<queue>.service``
(:func:`drop_in`, written by rq-scan) with ``User=NAME``, its primary group,
``SupplementaryGroups=rq`` (the daemon reads the root's config and scandir,
and writes the audit trail and batches, as group rq), and an
``ExecStartPre=+rqsys queue-owner %i``; ``"user": "dynamic"`` gets
``DynamicUser=yes`` under a name derived from the queue's
(:func:`dynamic_name`).  So the daemon and its scripts run as that user.

``queue-owner`` runs as root before each start (:func:`hand_over`): the
queue's directory and all in it become the user's, group ``rq-web`` (the
console's, which reads every queue), the top directory 2750: no other
queue's script can read it.  Once the queue has no user, the same command
gives it back to the owner of ``queue/`` (rq:rq, 2770); rq-scan keeps the
drop-in, without ``User=``, until then.  The walk happens only when the top
directory's owner, group or mode differ (its own change comes last, so a
walk cut short is done again).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rqsys import config
from rqsys.errors import ConfigError
from rqsys.observe.audit import AUDIT_KEEP, SUFFIX
from rqsys.run.identity import DYNAMIC, dynamic_name
from rqsys.store import Layout

DROP_IN_NAME = "50-rqsys-user.conf"
CONSOLE_GROUP = "rq-web"  # the console's group: it reads every queue's directory
SERVICE_GROUP = "rq"
PRIVATE_MODE = 0o2750  # a queue's own user's: its group is the console's
SHARED_MODE = 0o2770  # a queue of user rq's, as rq-scan makes it
HEADER = ("# Made by rq-scan from the queue's config.json \"user\";\n"
          "# rewritten or removed with it.\n[Service]\n")


def user_lines(queue: str, cfg: Mapping[str, Any]) -> list[str]:
    """``User=`` and its company for a queue's ``user`` ([] for none, or for
    a user that does not exist: the daemon then runs as rq and refuses)."""
    name = cfg.get("user") or ""
    if name == DYNAMIC:
        lines = ["DynamicUser=yes", f"User={dynamic_name(queue)}"]
    elif name:
        try:
            entry = pwd.getpwnam(name)
            group = grp.getgrgid(entry.pw_gid).gr_name
        except KeyError:
            return []
        # RemoveIPC= (the unit's) would remove the IPC objects of a user's other processes
        lines = [f"User={name}", f"Group={group}", "RemoveIPC=no"]
    else:
        return []
    return [*lines, f"SupplementaryGroups={SERVICE_GROUP}"]


def drop_in(queue: str, cfg: Mapping[str, Any], queue_dir: Path, executable: str) -> str:
    """The drop-in text for a queue's user; '' when it has none and its
    directory is already user rq's (or not made yet)."""
    lines = user_lines(queue, cfg)
    if not lines and not _handed_over(queue_dir):
        return ""
    return HEADER + "\n".join([*lines, f"ExecStartPre=+{executable} queue-owner %i"]) + "\n"


def _handed_over(queue_dir: Path) -> bool:
    """Whether the queue's directory is another user's than ``queue/``'s."""
    try:
        return os.lstat(queue_dir).st_uid != os.lstat(queue_dir.parent).st_uid
    except OSError:
        return False


def target(layout: Layout, queue: str) -> tuple[int, int, int]:
    """(uid, gid, mode) the queue's directory should have now."""
    name = config.load_queue_config(layout, queue).get("user") or ""
    try:
        uid = pwd.getpwnam(dynamic_name(queue) if name == DYNAMIC else name).pw_uid
    except KeyError:
        name = ""  # no such user: the daemon runs as rq, and refuses
    if not name:
        shared = os.stat(layout.queues)
        return shared.st_uid, shared.st_gid, SHARED_MODE
    try:
        return uid, grp.getgrnam(CONSOLE_GROUP).gr_gid, PRIVATE_MODE
    except KeyError:
        raise ConfigError(f"group {CONSOLE_GROUP} does not exist (systemd-sysusers makes it "
                          "from rqsys's sysusers.d/rqsys.conf)") from None


def hand_over(top: Path, uid: int, gid: int, mode: int) -> int:
    """Make the directory ``top`` and all in it owned by ``uid``:``gid``
    (directories setgid), ``top`` itself ``mode``; returns how many entries
    changed hands (0: ``top`` had them already, nothing was walked)."""
    st = os.lstat(top)
    if (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, gid, mode):
        return 0
    changed = 0
    for where, dirs, files in os.walk(top, topdown=False, onerror=_unreadable):
        for name in files:
            os.chown(os.path.join(where, name), uid, gid, follow_symlinks=False)
        for name in dirs:
            path = os.path.join(where, name)
            os.chown(path, uid, gid, follow_symlinks=False)
            if not os.path.islink(path):
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_ISGID)
        changed += len(files) + len(dirs)
    os.chown(top, uid, gid, follow_symlinks=False)
    os.chmod(top, mode)
    return changed + 1


def _unreadable(exc: OSError) -> None:
    """os.walk skips a directory it cannot list: here that is a hand-over not done whole."""
    raise exc


def hand_over_audit(audit_dir: Path, queue: str, uid: int) -> int:
    """The queue's audit files (``<queue>.jsonl`` and its rotated ones) its
    daemon's to append to; how many changed hands."""
    changed = 0
    for name in (f"{queue}{SUFFIX}", *(f"{queue}{SUFFIX}.{n}" for n in range(1, AUDIT_KEEP + 1))):
        try:
            if os.lstat(audit_dir / name).st_uid != uid:
                os.chown(audit_dir / name, uid, -1, follow_symlinks=False)
                changed += 1
        except FileNotFoundError:
            continue
    return changed


def main(layout: Layout, queue: str) -> int:
    """``rqsys queue-owner QUEUE`` (ExecStartPre=+ of a queue with a user)."""
    uid, gid, mode = target(layout, queue)
    try:
        changed = hand_over(layout.queue_dir(queue), uid, gid, mode)
        changed += hand_over_audit(layout.audit_dir, queue, uid)
    except OSError as exc:
        print(f"rqsys: queue {queue}: its directory cannot be handed to its user: {exc}",
              file=sys.stderr)
        return 1
    if changed:
        print(f"queue {queue}: {changed} entries now owned by uid {uid}, gid {gid} "
              f"(top directory {mode:o})")
    return 0
