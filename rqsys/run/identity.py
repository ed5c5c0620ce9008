"""A queue's Unix identity: the user its scripts run as (queue config ``user``).

Where the daemon already runs as that user (systemd started it so, from
rq-scan's drop-in) nothing is switched.  Where the daemon is root (embedded
mode under root) each run's child becomes the user between clone and exec
(``_native/spawn.c``: its job/ directory handed to it, then its groups,
group and user), and the queue's directory is made the user's (0700), so
no other queue's script can read it.  Anywhere else the queue runs nothing
and says why once (:attr:`Identity.refusal`): a script never runs as the
wrong user.
"""

from __future__ import annotations

import os
import pwd
import stat
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqsys.observe.events import EventLog

DYNAMIC = "dynamic"  # systemd's DynamicUser=: only systemd allocates such a user
PRIVATE_MODE = 0o700  # a queue directory of its own user's, in embedded mode
NAME_MAX = 31  # systemd's limit for a user name


@dataclass(frozen=True)
class QueueUser:
    """A user a queue's scripts run as, as the spawn helper takes it."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    c_groups: Any = field(default=None, compare=False)  # the groups as a C array, made once

    def environ(self) -> dict[str, str]:
        """What login(1) and systemd's User= set for it."""
        return {"USER": self.name, "LOGNAME": self.name, "HOME": self.home}


def lookup(name: str) -> QueueUser:
    """The user ``name`` with its groups (KeyError: there is none)."""
    entry = pwd.getpwnam(name)
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    from rqsys._native._rqspawn import ffi

    return QueueUser(name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir,
                     ffi.new("unsigned int[]", list(groups) or [entry.pw_gid]))


def dynamic_name(queue: str) -> str:
    """The user ``"user": "dynamic"`` runs queue ``queue`` as: ``rq-<queue>``,
    shortened with a checksum where the name would be too long."""
    name = f"rq-{queue}"
    if len(name) <= NAME_MAX:
        return name
    return f"rq-{queue[:NAME_MAX - 12]}-{zlib.crc32(queue.encode()):08x}"


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid without a name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def blocked_way(user: QueueUser, path: Path) -> str:
    """Why ``user`` cannot pass through the directories above ``path`` (its
    scripts could not enter their job/ directories), or ''."""
    for above in reversed(path.parents):
        try:
            st = os.stat(above)
        except OSError as exc:
            return f"cannot look at {above}: {exc.strerror}"
        bit = (0o100 if st.st_uid == user.uid else 0o010 if st.st_gid in user.groups
               else 0o001)
        if not st.st_mode & bit:
            return (f"user {user.name} (config \"user\") cannot pass through {above} "
                    f"(mode {stat.S_IMODE(st.st_mode):o}, owner {user_name(st.st_uid)}), "
                    "above the queue's directory")
    return ""


class Identity:
    """One queue daemon's identity for its scripts: checked against each config."""

    def __init__(self, queue: str, queue_dir: Path, log: EventLog, cfg: Mapping[str, Any],
                 euid: Callable[[], int] = os.geteuid) -> None:
        self.queue, self.queue_dir, self.log, self._euid = queue, queue_dir, log, euid
        self.switch: QueueUser | None = None  # who each run's child becomes, or None
        self.refusal = ""  # why no message of the queue may run, or ""
        self.configure(cfg)

    def configure(self, cfg: Mapping[str, Any]) -> None:
        """Take a (new) config's ``user``; say once when the queue cannot run."""
        name, refusal, switch = cfg.get("user") or "", "", None
        if name:
            refusal, switch = self._decide(name)
        if not refusal and self._euid() == 0:
            refusal = self._own_dir(switch)
        if refusal and refusal != self.refusal:
            self.log.event("err", f"{refusal}: no message of this queue runs; messages "
                           "stay queued")
        elif self.refusal and not refusal:
            self.log.event("daemon", "the queue's user can be honoured again: runs go on")
        self.refusal, self.switch = refusal, None if refusal else switch

    def _decide(self, name: str) -> tuple[str, QueueUser | None]:
        """(why not, who to become) for config ``user`` ``name``."""
        if name == DYNAMIC:
            return self._dynamic()
        try:
            user = lookup(name)
        except KeyError:
            return f"user {name} (config \"user\") does not exist on this host", None
        me = self._euid()
        if me == user.uid:
            return "", None  # already it: nothing to switch
        if me == 0:
            return blocked_way(user, self.queue_dir), user
        return (f"the queue's scripts run as user {name} (config \"user\"), but this daemon "
                f"runs as {user_name(me)} and cannot become it (a daemon running as root "
                "can)", None)

    def _dynamic(self) -> tuple[str, QueueUser | None]:
        """``"user": "dynamic"``: only systemd allocates it (rq-scan's drop-in)."""
        name = dynamic_name(self.queue)
        try:
            if pwd.getpwuid(self._euid()).pw_name == name:
                return "", None  # systemd started us as it
        except KeyError:
            pass
        return (f"user \"{DYNAMIC}\" is systemd's DynamicUser= ({name}), which only "
                f"rq@{self.queue}.service under systemd runs as", None)

    def _own_dir(self, user: QueueUser | None) -> str:
        """The queue's directory the user's alone (0700) while its scripts run
        as it; the daemon's again (0755) once the queue has no user.  Returns
        why it cannot be, or ''."""
        try:
            st = os.lstat(self.queue_dir)
        except FileNotFoundError:
            return ""  # made later, by the store, as the daemon's
        except OSError as exc:
            return f"cannot look at {self.queue_dir}: {exc.strerror}"
        if user is None and st.st_uid == self._euid():
            return ""
        uid, gid, mode = ((user.uid, user.gid, PRIVATE_MODE) if user is not None
                          else (self._euid(), os.getegid(), 0o755))
        try:
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.chown(self.queue_dir, uid, gid, follow_symlinks=False)
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(self.queue_dir, mode)
        except OSError as exc:
            return f"cannot make {self.queue_dir} the queue user's: {exc.strerror}"
        return ""
