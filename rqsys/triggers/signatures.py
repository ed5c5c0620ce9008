"""Webhook signatures, each checked over the raw body in constant time.

- ``github``: ``X-Hub-Signature-256: sha256=<hex>``, HMAC-SHA256 of the body;
- ``gitlab``: ``X-Gitlab-Token``, the secret itself;
- ``stripe``: ``Stripe-Signature: t=<unix time>,v1=<hex>[,v1=...]``, HMAC-SHA256
  of ``<t>.<body>``, its ``t`` within ``tolerance`` seconds of now;
- ``hmac-sha256``: a hex HMAC-SHA256 of the body in the trigger's ``header``
  (``sha256=`` before it is allowed).

Every comparison is :func:`hmac.compare_digest`; a missing or malformed
header is a :class:`BadSignature` like a wrong one.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable

from rqsys.errors import RQError

Headers = Callable[[str], "str | None"]  # a header by name (case-insensitive), or None
KINDS = ("github", "gitlab", "stripe", "hmac-sha256")
MAX_HEADER = 4096  # a longer signature header is refused unread


class BadSignature(RQError):
    """A webhook's signature is missing, malformed, wrong or out of date (HTTP 401)."""


def verify(kind: str, secret: bytes, body: bytes, header: Headers, *, name: str = "",
           tolerance: int = 300, now: float | None = None) -> None:
    """Pass, or BadSignature saying why (never the expected value)."""
    if not secret:
        raise BadSignature("the trigger's secret is empty")
    if kind == "github":
        _hex_hmac(secret, body, _given(header, "X-Hub-Signature-256"), required_prefix=True)
    elif kind == "gitlab":
        given = _given(header, "X-Gitlab-Token").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, secret):
            raise BadSignature("X-Gitlab-Token is not the secret")
    elif kind == "stripe":
        stripe(secret, body, _given(header, "Stripe-Signature"), tolerance,
               time.time() if now is None else now)
    elif kind == "hmac-sha256":
        _hex_hmac(secret, body, _given(header, name or "X-Signature"), required_prefix=False)
    else:
        raise BadSignature(f"unknown signature kind {kind!r}")


def _given(header: Headers, name: str) -> str:
    value = header(name)
    if not value:
        raise BadSignature(f"no {name} header")
    if len(value) > MAX_HEADER:
        raise BadSignature(f"{name} is too long")
    return value.strip()


def sign(secret: bytes, data: bytes) -> str:
    """The hex HMAC-SHA256 of ``data`` (what a sender puts in its header)."""
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def _hex_hmac(secret: bytes, body: bytes, given: str, required_prefix: bool) -> None:
    scheme, sep, digest = given.partition("=")
    if not sep:
        if required_prefix:
            raise BadSignature("the signature does not start with sha256=")
        digest = given
    elif scheme.strip().lower() != "sha256":
        raise BadSignature("the signature is not sha256=<hex>")
    if not hmac.compare_digest(digest.strip().lower().encode("ascii", "replace"),
                               sign(secret, body).encode()):
        raise BadSignature("the signature does not match the body")


def stripe(secret: bytes, body: bytes, given: str, tolerance: int, now: float) -> None:
    """Stripe's scheme: any ``v1`` of the header signs ``<t>.<body>``, and ``t``
    is at most ``tolerance`` seconds away from ``now``."""
    stamps, signed = [], []
    for item in given.split(","):
        key, _sep, value = item.strip().partition("=")
        if key == "t":
            stamps.append(value.strip())
        elif key == "v1":
            signed.append(value.strip().lower())
    if len(stamps) != 1 or not (stamps[0].isascii() and stamps[0].isdigit()) or not signed:
        raise BadSignature("Stripe-Signature needs one t=<time> and a v1=<hex>")
    expected = sign(secret, stamps[0].encode() + b"." + body).encode()
    if not any(hmac.compare_digest(s.encode("ascii", "replace"), expected) for s in signed):
        raise BadSignature("the signature does not match the body")
    if abs(now - int(stamps[0])) > tolerance:
        raise BadSignature(f"the signature's time is more than {tolerance} s from now")
