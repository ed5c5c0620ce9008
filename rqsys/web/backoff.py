"""Backoff after failed logins: who may try a password now, in bounded memory.

The policy (``Gate``), with the numbers below:

- **Per address** (any user): ``ADDRESS_FREE`` (20) failures are free; the
  20th starts a backoff of ``BASE`` (1 s), and each further failure doubles
  it, up to ``CAP`` (5 minutes).  This stops one address guessing many
  users' passwords.  An IPv6 address counts by its /64 (one host's usual
  share), an IPv4-mapped one as IPv4.
- **Per (user, address)**: ``PAIR_FREE`` (10) failures, then the same
  doubling.  A success from that address clears this record (not the
  address's: an account holder must not reset a counter with which to
  guess others' passwords).  Names not in ``basic_auth.users`` and
  undecodable headers count as one user, so made-up names take no memory.
- **Per user** (any address): after ``USER_FREE`` (50) failures for one
  user, the same doubling applies to the addresses that have *failed* for
  that user: a guesser spread over many addresses gets one try per address
  and backoff, not ten.  An address with no failure for the user is never
  refused by it, so the user's right password from their own address works
  while the account is under attack.

While a record is in backoff its requests are answered 429 with
``Retry-After`` without running argon2 (no guess, no CPU).  From one
failure short of a backoff on, a record lets one check run at a time (the
others get 429 for 1 s), so the web's 16 threads cannot race past a
backoff with guesses in parallel.  A record is forgotten after ``FORGET``
(1 hour) without a failure, so a guesser that waits the 5-minute cap keeps
it: about 290 guesses a day per address at most.  Each table keeps at most
``TABLE_MAX`` records, dropping the least recently failed first: an
attacker with many addresses can make it forget, not grow.

Why these numbers: the free failures leave room for typing slips and for a
script with a stale password retrying, and stay far under the 100 that
NIST SP 800-63B allows; a 1 s first wait goes unnoticed by a person, and
doubling reaches the cap after 9 more failures; 5 minutes is fail2ban's
kind of ban, short enough that an operator locked out by a colleague's
typos is not locked out for long.

Behind a reverse proxy every client has the proxy's address: the per
address backoff then applies to all of them together (rqsys trusts no
forwarded-for header).
"""

from __future__ import annotations

import ipaddress
import math
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

BASE = 1.0  # seconds of the first backoff
CAP = 300.0  # the longest backoff
FORGET = 3600.0  # a record without a failure for this long is dropped
ADDRESS_FREE = 20
PAIR_FREE = 10
USER_FREE = 50
TABLE_MAX = 10_000  # records per table (about 200 bytes each)
NAME_SHOWN = 64  # characters of a user name in the log

REASONS = ("password", "user", "malformed")  # wrong password, no such user, undecodable
SCOPES = ("address", "user_address", "user")


def delay(failures: int, free: int) -> float:
    """Seconds of backoff after ``failures`` failures, ``free`` of them without."""
    if failures < free:
        return 0.0
    return min(BASE * 2.0 ** min(failures - free, 32), CAP)


def address_key(remote: str | None) -> str:
    """The address as counted: IPv4 whole, IPv6 by its /64."""
    try:
        ip = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return (remote or "-")[:NAME_SHOWN]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


@dataclass
class Record:
    """Failures of one key: how many, the last one's time, checks in flight."""

    last: float
    failures: int = 0
    busy: int = 0

    def wait(self, free: int, now: float) -> float:
        """Seconds until a try is allowed (0 or less: now)."""
        return self.last + delay(self.failures, free) - now

    def crowded(self, free: int) -> bool:
        """One failure short of a backoff or past it, a check is in flight."""
        return self.busy > 0 and self.failures >= free - 1


class Table:
    """Records of failures by key, the least recently failed first; bounded in size and age."""

    def __init__(self, free: int, limit: int = TABLE_MAX) -> None:
        self.free = free
        self.limit = limit
        self.records: OrderedDict[object, Record] = OrderedDict()

    def get(self, key: object, now: float) -> Record | None:
        record = self.records.get(key)
        if record is not None and now - record.last > FORGET:
            del self.records[key]
            return None
        return record

    def fail(self, key: object, now: float) -> Record:
        """Count a failure of ``key``; its record, made if need be."""
        record = self.get(key, now)
        if record is None:
            record = self.records[key] = Record(last=now)
        record.failures += 1
        record.last = now
        self.records.move_to_end(key)
        self._trim(now)
        return record

    def clear(self, key: object) -> None:
        self.records.pop(key, None)

    def _trim(self, now: float) -> None:
        while self.records:
            key, oldest = next(iter(self.records.items()))
            if len(self.records) <= self.limit and now - oldest.last <= FORGET:
                return
            del self.records[key]


@dataclass(frozen=True)
class Who:
    """One login try: the address counted and shown, the user counted and shown."""

    address: str
    shown_address: str
    user: str | None  # None: a name not in basic_auth.users, or no name at all
    shown_user: str

    def counted(self) -> list[tuple[str, object]]:
        """(scope, key) of each record this try counts in."""
        keys: list[tuple[str, object]] = [("address", self.address),
                                          ("user_address", (self.user, self.address))]
        return keys + [("user", self.user)] if self.user is not None else keys


def who(remote: str | None, user: str, known: bool, well_formed: bool = True) -> Who:
    """The try of ``user`` (``known``: in basic_auth.users) from ``remote``;
    the name shown escaped (repr: no newline or escape reaches the log) and cut."""
    shown = repr(user[:NAME_SHOWN]) if well_formed else "(undecodable)"
    return Who(address_key(remote), (remote or "-")[:NAME_SHOWN], user if known else None, shown)


@dataclass
class Ticket:
    """A try let in (``refused`` None) or not, and the records it holds meanwhile."""

    who: Who
    refused: tuple[str, int] | None = None  # (scope, seconds to wait)
    held: list[Record] = field(default_factory=list)


@dataclass
class Counts:
    """What ``/metrics`` shows: failures by reason, refusals and backoffs by scope."""

    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SCOPES, 0))
    backoffs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SCOPES, 0))


def log_line(text: str) -> None:
    """One line on the web's standard error (the journal under systemd)."""
    sys.stderr.write(f"rqsys web: {text}\n")
    sys.stderr.flush()


class Gate:
    """The backoff policy (see the module's docstring), shared by the web's threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = log_line) -> None:
        self.clock = clock
        self.log = log
        self.tables = {"address": Table(ADDRESS_FREE), "user_address": Table(PAIR_FREE),
                       "user": Table(USER_FREE)}
        self.counts = Counts()
        self.lock = threading.Lock()

    def enter(self, who: Who) -> Ticket:
        """A ticket for the try: refused (with the seconds to wait), or let in
        and held until ``leave``."""
        ticket = Ticket(who)
        with self.lock:
            now = self.clock()
            ticket.refused = self._refusal(who, now)
            if ticket.refused is not None:
                self.counts.refused[ticket.refused[0]] += 1
                return ticket
            for scope, key in who.counted():
                record = self.tables[scope].get(key, now)
                if record is not None:
                    record.busy += 1
                    ticket.held.append(record)
        return ticket

    def leave(self, ticket: Ticket, ok: bool | None, reason: str = "password") -> None:
        """The try ended: ``ok`` True (right), False (a failure), None (no answer)."""
        who, started = ticket.who, []
        with self.lock:
            now = self.clock()
            for record in ticket.held:
                record.busy -= 1
            if ok:
                self.tables["user_address"].clear((who.user, who.address))
            elif ok is False:
                self.counts.failures[reason] += 1
                started = [self._fail(scope, key, now) for scope, key in who.counted()]
        if ok is False:
            self._log_failure(who, reason, started)

    def _refusal(self, who: Who, now: float) -> tuple[str, int] | None:
        """The scope that makes ``who`` wait longest, and how many seconds."""
        waits = [(self._wait(scope, key, who, now), scope) for scope, key in who.counted()]
        longest, scope = max(waits, key=lambda pair: pair[0])
        return (scope, max(1, math.ceil(longest))) if longest > 0 else None

    def _wait(self, scope: str, key: object, who: Who, now: float) -> float:
        table = self.tables[scope]
        record = table.get(key, now)
        if record is None or (scope == "user" and not self._failed_here(who, now)):
            return 0.0
        wait = record.wait(table.free, now)
        if wait <= 0 and scope != "user" and record.crowded(table.free):
            return BASE
        return wait

    def _failed_here(self, who: Who, now: float) -> bool:
        return self.tables["user_address"].get((who.user, who.address), now) is not None

    def _fail(self, scope: str, key: object, now: float) -> tuple[str, str]:
        """Count the failure; (scope, a line for the log) when it set a backoff."""
        table = self.tables[scope]
        record = table.fail(key, now)
        if record.failures < table.free:
            return scope, ""
        self.counts.backoffs[scope] += 1
        return scope, (f"{record.failures} failures, "
                       f"refused for {delay(record.failures, table.free):g} s")

    def _log_failure(self, who: Who, reason: str, started: list[tuple[str, str]]) -> None:
        why = {"password": "wrong password", "user": "no such user",
               "malformed": "undecodable credentials"}[reason]
        user, address = who.shown_user, who.shown_address
        self.log(f"login failed: user {user} from {address} ({why})")
        whom = {"address": f"address {address}", "user_address": f"user {user} from {address}",
                "user": f"user {user} from every address that failed for it"}
        for scope, text in started:
            if text:
                self.log(f"login backoff: {whom[scope]}: {text}")
