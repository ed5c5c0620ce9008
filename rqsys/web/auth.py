"""HTTP Basic authentication on every route when ``basic_auth`` is configured.

``basic_auth.users`` maps a user to an argon2 hash (``rqsys passwd`` makes
one), or to ``{"password": <hash>, "role", "queues"}`` (``rqsys.wire.roles``:
what the user may do is ``rqsys.web.access``'s), or for old configs to the
password itself (a warning at every start names the user).  argon2 is slow
on purpose (tens of ms), and a browser sends the credentials with every
request of a page, so a successful check is remembered in memory for
VERIFIED_TTL seconds, keyed by the user and a SHA-256 of the password:
never the password itself.

Failed logins back off (``rqsys.web.backoff``: per address, per user and
address, per user): while one applies, the try is answered 429 with
``Retry-After`` before any check.  A request without credentials is
answered 401 (a browser's first) and is no failure; an undecodable
``Authorization: Basic`` header is one.  A webhook trigger's ``POST
/hooks/<name>`` takes none (:func:`signed_hook`): its signature is its
authentication (``rqsys.web.hooks``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import argon2
import falcon

from rqsys.triggers.spec import NAME_PATTERN
from rqsys.web import backoff
from rqsys.wire import roles
from rqsys.wire.roles import accounts

Exempt = Callable[[falcon.Request], bool]
HASH_PREFIX = "$argon2"
VERIFIED_TTL = 60.0
VERIFIED_MAX = 1024  # remembered successes; the table is emptied when full


def signed_hook(prefix: str) -> Exempt:
    """Whether a request is a ``POST <prefix>/hooks/<name>`` (a webhook trigger,
    signed: no basic auth, and it passes the Host and CSRF checks as a peer's
    request does)."""
    pattern = re.compile(re.escape(prefix) + "/hooks/" + NAME_PATTERN)

    def signed(req: falcon.Request) -> bool:
        return req.method == "POST" and pattern.fullmatch(req.path) is not None

    return signed


def is_hash(value: str) -> bool:
    return value.startswith(HASH_PREFIX)


def hash_password(password: str) -> str:
    """An argon2id hash (argon2-cffi's default parameters) to put in ``basic_auth.users``."""
    return str(argon2.PasswordHasher().hash(password))


def plain_text_warnings(settings: dict[str, Any] | None) -> list[str]:
    """One warning per user whose password is stored as plain text."""
    return [f"warning: basic_auth user {user!r} has a plain-text password in config.json; "
            "replace it with the hash `rqsys passwd` prints"
            for user, account in sorted(accounts(settings).items())
            if not is_hash(account.password)]


class Verifier:
    """Checks a (user, password) pair; remembers successes for a short while."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self.hasher = argon2.PasswordHasher()
        self.verified: dict[tuple[str, bytes], float] = {}
        self.lock = threading.Lock()

    def check(self, user: str, password: str) -> bool:
        key = (user, hashlib.sha256(password.encode("utf-8", "surrogatepass")).digest())
        with self.lock:
            if self.verified.get(key, 0.0) > time.monotonic():
                return True
        if not self._verify(self.users.get(user), password):
            return False
        with self.lock:
            if len(self.verified) >= VERIFIED_MAX:
                self.verified.clear()
            self.verified[key] = time.monotonic() + VERIFIED_TTL
        return True

    def _verify(self, expected: str | None, password: str) -> bool:
        if expected is None:
            return False
        if not is_hash(expected):
            return hmac.compare_digest(expected.encode(), password.encode("utf-8", "replace"))
        try:
            return bool(self.hasher.verify(expected, password))
        except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
            return False


class Credentials(NamedTuple):
    """What an ``Authorization: Basic`` header holds; ``well_formed`` False
    when it does not decode to ``user:password`` in UTF-8."""

    user: str
    password: str
    well_formed: bool = True


class BasicAuth:
    """falcon middleware: 401 with a challenge unless the credentials match,
    429 while failed logins back off (``gate``, which ``/metrics`` reads)."""

    def __init__(self, settings: dict[str, Any] | None,
                 gate: backoff.Gate | None = None, exempt: Exempt | None = None) -> None:
        self.exempt = exempt  # requests that authenticate otherwise (signed_hook)
        self.realm = str((settings or {}).get("realm", "rqsys"))
        users = {user: account.password for user, account in accounts(settings).items()}
        self.verifier = Verifier(users)
        self.gate = gate or backoff.Gate()
        self.enabled = settings is not None

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self.enabled or (self.exempt is not None and self.exempt(req)):
            return
        given = _credentials(req.auth)
        if given is None:
            self._refuse("credentials required")
        elif not self._check(given, req.remote_addr):
            self._refuse("wrong user name or password")
        else:
            req.context.user = given.user

    def _check(self, given: Credentials, remote: str | None) -> bool:
        known = given.well_formed and given.user in self.verifier.users
        ticket = self.gate.enter(backoff.who(remote, given.user, known, given.well_formed))
        if ticket.refused is not None:
            raise falcon.HTTPTooManyRequests(
                title="too many failed logins",
                description=f"try again in {ticket.refused[1]} s", retry_after=ticket.refused[1])
        ok: bool | None = None
        try:
            ok = known and self.verifier.check(given.user, given.password)
        finally:
            reason = "password" if known else "user" if given.well_formed else "malformed"
            self.gate.leave(ticket, ok, reason)
        return bool(ok)

    def _refuse(self, why: str) -> None:
        realm = self.realm.replace('"', "'")
        raise falcon.HTTPUnauthorized(title="authentication required", description=why,
                                      challenges=[f'Basic realm="{realm}"'])


def _credentials(header: str | None) -> Credentials | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return Credentials("", "", well_formed=False)
    user, sep, password = decoded.partition(":")
    return Credentials(user, password) if sep else Credentials("", "", well_formed=False)


def acting(req: falcon.Request) -> dict[str, Any]:
    """The ``actor`` the web names in a request to a daemon: its user and address,
    and the user's role and queues, which the daemon checks on its own queue
    too (``rqsys.wire.roles.require``: a daemon asked to act on another queue
    carries them there); a daemon believes it only from the web's own user."""
    account = getattr(req.context, "account", None) or roles.ADMIN
    return {"user": str(getattr(req.context, "user", None) or ""),
            "address": str(req.remote_addr or "")[:100], "role": account.role,
            **({} if account.queues is None else {"queues": list(account.queues)})}


def actor(req: falcon.Request) -> str:
    """Who asks over HTTP: the basic-auth user, else ``http <address>``."""
    user = getattr(req.context, "user", None)
    return str(user) if user else f"http {req.remote_addr}"
