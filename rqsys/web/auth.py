"""HTTP Basic authentication on every route when ``basic_auth`` is configured.

``basic_auth.users`` maps a user to an argon2 hash (``rqsys passwd`` makes
one) or, for old configs, to the password itself (a warning at every start
names the user).  argon2 is slow on purpose (tens of ms), and a browser
sends the credentials with every request of a page, so a successful check
is remembered in memory for VERIFIED_TTL seconds, keyed by the user and a
SHA-256 of the password: never the password itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
import time
from typing import Any

import argon2
import falcon

HASH_PREFIX = "$argon2"
VERIFIED_TTL = 60.0
VERIFIED_MAX = 1024  # remembered successes; the table is emptied when full


def is_hash(value: str) -> bool:
    return value.startswith(HASH_PREFIX)


def hash_password(password: str) -> str:
    """An argon2id hash (argon2-cffi's default parameters) to put in ``basic_auth.users``."""
    return str(argon2.PasswordHasher().hash(password))


def plain_text_warnings(settings: dict[str, Any] | None) -> list[str]:
    """One warning per user whose password is stored as plain text."""
    users = (settings or {}).get("users", {})
    return [f"warning: basic_auth user {user!r} has a plain-text password in config.json; "
            "replace it with the hash `rqsys passwd` prints"
            for user, value in sorted(users.items()) if not is_hash(str(value))]


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


class BasicAuth:
    """falcon middleware: 401 with a challenge unless the credentials match."""

    def __init__(self, settings: dict[str, Any] | None) -> None:
        self.realm = str((settings or {}).get("realm", "rqsys"))
        users = {str(k): str(v) for k, v in (settings or {}).get("users", {}).items()}
        self.verifier = Verifier(users)
        self.enabled = settings is not None

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self.enabled:
            return
        user, password = _credentials(req.auth)
        if user is None:
            self._refuse("credentials required")
        if not self.verifier.check(user or "", password):
            self._refuse("wrong user name or password")
        req.context.user = user

    def _refuse(self, why: str) -> None:
        realm = self.realm.replace('"', "'")
        raise falcon.HTTPUnauthorized(title="authentication required", description=why,
                                      challenges=[f'Basic realm="{realm}"'])


def _credentials(header: str | None) -> tuple[str | None, str]:
    if not header or not header.lower().startswith("basic "):
        return None, ""
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return "", ""
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else ("", "")


def actor(req: falcon.Request) -> str:
    """Who asks over HTTP: the basic-auth user, else ``http <address>``."""
    user = getattr(req.context, "user", None)
    return str(user) if user else f"http {req.remote_addr}"
