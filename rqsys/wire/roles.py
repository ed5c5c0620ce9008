"""Who may do what: the roles viewer, operator and admin, for HTTP users and socket peers.

A role includes the ones below it:

* **viewer**: every read (pages, lists, messages, output, stats, search);
* **operator**: also what changes messages: send, attach, commit, retry,
  resend, run_now, cancel, delete, destroy, move, bulk actions, batches;
* **admin**: also what changes a queue: up, pause, down, reload, prune,
  new queues.

An HTTP user (``basic_auth.users``) is a password hash (an admin, as every
config before roles) or ``{"password", "role", "queues"}``; ``queues``
(shell globs, default all) narrows what the user sees and acts on.

A socket peer's role comes from the kernel (``SO_PEERCRED`` and
``SO_PEERGROUPS``): root and the daemon's own user are admins (the web, the
timers and the queues' own scripts run as it); a member of group
``rq-admin`` (or ``rq-web``, the console's) is an admin, of group ``rq`` an
operator, of group ``rq-view`` a viewer; anyone else may do nothing.

An admin peer acting for someone else carries that one's identity in the
request's ``actor`` (``{"user", "address", "role", "queues"}``): the web for
its HTTP user, a queue daemon for the client whose request makes it ask
another queue (a bulk move's copies).  The daemon that gets
it answers by that role on its own queue (:func:`require`), so a daemon
never lends its own admin role to a client of another queue.
"""

from __future__ import annotations

import functools
import grp
import os
import socket
import struct
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from rqsys.errors import Forbidden

ROLES = ("viewer", "operator", "admin")
# best first; rq-web: the console's own group (it reads queues of their own users)
GROUPS = {"rq-admin": "admin", "rq-web": "admin", "rq": "operator", "rq-view": "viewer"}
NOBODY = ""  # a peer with no role
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13; Python does not name it
MAX_GROUPS = 256  # Python reads at most 1024 bytes of an option: past it, the primary group

# Each socket operation's role, decided by what it does: every op that can
# change a message or the queue (each of its actions: ``bulk`` and ``group``
# retry, delete or move; none of them reads only) needs an operator or an
# admin, and is in MUTATING; one not named here needs an admin.
READS = ("ping", "counts", "config", "list", "get", "state", "status", "stats", "search",
         "groups", "watch", "pool")
OPS = {
    **dict.fromkeys(READS, "viewer"),
    **dict.fromkeys(("create", "create_many", "attach", "clone", "commit", "run_now",
                     "retry", "delete", "destroy", "cancel", "bulk", "group"), "operator"),
    **dict.fromkeys(("adminoper", "reload", "prune"), "admin"),
}
# What the audit trail records (``rqsys.daemon.audit``): every op that can
# change state, whatever its role; ``reload`` re-reads the queue's config.
MUTATING = frozenset(op for op in OPS if op not in READS)


def rank(role: str) -> int:
    return ROLES.index(role) + 1 if role in ROLES else 0


def covers(have: str, need: str) -> bool:
    """Whether role ``have`` includes role ``need``."""
    return rank(have) >= rank(need) > 0


@dataclass(frozen=True)
class Account:
    """An HTTP user: its password (an argon2 hash), its role, and its queues (None: all)."""

    password: str
    role: str = "admin"
    queues: tuple[str, ...] | None = None

    def sees(self, queue: str) -> bool:
        return self.queues is None or any(fnmatchcase(queue, glob) for glob in self.queues)

    def may(self, need: str, queue: str | None = None) -> bool:
        return covers(self.role, need) and (queue is None or self.sees(queue))

    def require(self, need: str, queue: str | None = None) -> None:
        """Forbidden, naming the role needed, unless this user may."""
        if not self.may(need, queue):
            raise Forbidden(refusal(need, self.role, queue))


ADMIN = Account("", "admin")  # no basic_auth: whoever reaches the web (local only)


def account_of(value: Any) -> Account:
    """``basic_auth.users``'s value for a user, as an Account."""
    if isinstance(value, dict):
        queues = value.get("queues")
        return Account(str(value.get("password", "")), str(value.get("role", "admin")),
                       None if queues is None else tuple(str(g) for g in queues))
    return Account(str(value))


def accounts(settings: dict[str, Any] | None) -> dict[str, Account]:
    return {str(user): account_of(value)
            for user, value in (settings or {}).get("users", {}).items()}


def refusal(need: str, have: str, queue: str | None = None) -> str:
    where = f" on queue {queue}" if queue else ""
    return f"this needs the {need} role{where} (you have: {have or 'none'})"


# ------------------------------------------------------------ socket peers
def peer_role(sock: socket.socket) -> str:
    """The role of the process at the other end of a unix socket."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return NOBODY
    _pid, uid, gid = struct.unpack("3i", creds)
    if uid in (0, os.geteuid()):
        return "admin"
    return role_of_groups({gid, *_peer_groups(sock)}, _group_ids())


def role_of_groups(gids: set[int], named: dict[str, int]) -> str:
    """The best role the groups ``gids`` give (``named``: group name -> gid)."""
    for name, role in GROUPS.items():
        if name in named and named[name] in gids:
            return role
    return NOBODY


def _peer_groups(sock: socket.socket) -> list[int]:
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * MAX_GROUPS)
    except OSError:
        return []
    return list(struct.unpack(f"{len(data) // 4}I", data[:len(data) // 4 * 4]))


@functools.cache
def _group_ids() -> dict[str, int]:
    """The role groups' ids, looked up once a process (NSS may ask another
    process: not on every connection of a daemon's loop).  A group made
    later counts from the daemon's next start."""
    found = {}
    for name in GROUPS:
        try:
            found[name] = grp.getgrnam(name).gr_gid
        except KeyError:
            pass
    return found


def op_role(op: str) -> str:
    return OPS.get(op, "admin")


def mutates(op: str) -> bool:
    """Whether ``op`` can change state (an op not in the table is taken as one)."""
    return op not in READS


# ------------------------------------------------------------ acting for another
def carried(actor: Any) -> Account | None:
    """The identity an admin peer carries in a request's ``actor`` for the one
    it acts for (the web for its HTTP user, a daemon for its own client):
    ``{"role", "queues"}``; None when it carries none (it acts as itself).
    A role that is none of ROLES may do nothing."""
    if not isinstance(actor, dict) or "role" not in actor:
        return None
    queues = actor.get("queues")
    if queues is not None and not isinstance(queues, list):
        queues = []  # not a list of globs: no queue (the request's schema refuses it too)
    return Account("", str(actor["role"]),
                   None if queues is None else tuple(str(g) for g in queues))


def require(peer: str, actor: Any, queue: str, need: str) -> None:
    """Forbidden unless a request may do what needs role ``need`` on ``queue``:
    its peer's role, and when an admin peer acts for someone (``carried``),
    that one's role on ``queue`` (a daemon does not lend its own)."""
    account = carried(actor) if peer == "admin" else None
    if account is not None:
        account.require(need, queue)
    elif not covers(peer, need):
        raise Forbidden(refusal(need, peer))
