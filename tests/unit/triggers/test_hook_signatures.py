"""Webhook signature checks (rqsys.triggers.signatures): each provider's scheme
computed as its documentation says, and every way to get it wrong."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from rqsys.triggers.signatures import BadSignature, verify

SECRET = b"It's a Secret to Everybody"
BODY = b'{"zen": "Keep it logically awesome."}'
NOW = 1_700_000_000


def _hex(data: bytes, secret: bytes = SECRET) -> str:
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def headers(**given: str):
    lower = {k.lower().replace("_", "-"): v for k, v in given.items()}
    return lambda name: lower.get(name.lower())


def test_github_documented_example():
    # GitHub's docs: secret "It's a Secret to Everybody", payload "Hello, World!"
    expected = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    verify("github", SECRET, b"Hello, World!",
           headers(X_Hub_Signature_256=f"sha256={expected}"))
    verify("github", SECRET, b"Hello, World!",
           headers(X_Hub_Signature_256=f"sha256={expected.upper()}"))


@pytest.mark.parametrize("value", [
    None, "", "sha256=", "sha1=" + _hex(BODY), _hex(BODY), "sha256=" + _hex(BODY + b" "),
    "sha256=" + _hex(BODY, b"other"), "sha256=" + "é" * 64, "sha256=" + "0" * 10_000])
def test_github_refuses(value):
    given = headers() if value is None else headers(X_Hub_Signature_256=value)
    with pytest.raises(BadSignature):
        verify("github", SECRET, BODY, given)


def test_gitlab_token_is_the_secret():
    verify("gitlab", SECRET, BODY, headers(X_Gitlab_Token=SECRET.decode()))
    for wrong in ("", "It's a secret to everybody", SECRET.decode()[:-1]):
        with pytest.raises(BadSignature):
            verify("gitlab", SECRET, BODY, headers(X_Gitlab_Token=wrong))


def _stripe(at: int, body: bytes = BODY, secret: bytes = SECRET) -> str:
    return f"t={at},v1={_hex(f'{at}.'.encode() + body, secret)}"


def test_stripe_within_tolerance_and_a_rolled_secret_among_v1s():
    verify("stripe", SECRET, BODY, headers(Stripe_Signature=_stripe(NOW - 299)),
           tolerance=300, now=NOW)
    both = f"{_stripe(NOW)},v1={_hex(b'x', b'old')},v0=ignored"
    verify("stripe", SECRET, BODY, headers(Stripe_Signature=both), tolerance=300, now=NOW)


@pytest.mark.parametrize("value", [
    _stripe(NOW - 301), _stripe(NOW + 301), f"t={NOW}", f"v1={_hex(BODY)}",
    f"t=abc,v1={_hex(BODY)}", f"t={NOW},t={NOW},v1={_hex(f'{NOW}.'.encode() + BODY)}",
    _stripe(NOW, BODY + b"!"), _stripe(NOW, secret=b"other"),
    f"t={NOW},v1={_hex(BODY)}"])  # the body alone is not what Stripe signs
def test_stripe_refuses(value):
    with pytest.raises(BadSignature):
        verify("stripe", SECRET, BODY, headers(Stripe_Signature=value), tolerance=300, now=NOW)


def test_plain_hmac_in_the_named_header():
    verify("hmac-sha256", SECRET, BODY, headers(X_My_Sig=_hex(BODY)), name="X-My-Sig")
    verify("hmac-sha256", SECRET, BODY, headers(X_My_Sig="sha256=" + _hex(BODY)),
           name="X-My-Sig")
    with pytest.raises(BadSignature):  # in another header than the one named
        verify("hmac-sha256", SECRET, BODY, headers(X_Signature=_hex(BODY)), name="X-My-Sig")
    with pytest.raises(BadSignature):
        verify("hmac-sha256", SECRET, BODY, headers(X_My_Sig=_hex(b"")), name="X-My-Sig")


def test_an_empty_secret_or_unknown_kind_signs_nothing():
    with pytest.raises(BadSignature, match="empty"):
        verify("gitlab", b"", BODY, headers(X_Gitlab_Token=""))
    with pytest.raises(BadSignature, match="unknown"):
        verify("md5", SECRET, BODY, headers())


def test_the_expected_value_is_never_in_the_error():
    with pytest.raises(BadSignature) as caught:
        verify("github", SECRET, BODY, headers(X_Hub_Signature_256="sha256=00"))
    assert _hex(BODY) not in str(caught.value)
