"""HTTP Basic authentication on every route when ``basic_auth`` is configured."""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Any

import falcon


class BasicAuth:
    """falcon middleware: 401 with a challenge unless the credentials match."""

    def __init__(self, settings: dict[str, Any] | None) -> None:
        self.realm = str((settings or {}).get("realm", "rqsys"))
        self.users = {str(k): str(v) for k, v in (settings or {}).get("users", {}).items()}
        self.enabled = settings is not None

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self.enabled:
            return
        user, password = _credentials(req.auth)
        if user is None:
            self._refuse("credentials required")
        expected = self.users.get(user or "")
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            self._refuse("wrong user name or password")

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
