"""``rqsys passwd [--role R] [--queues GLOB...] [USER]``: read a password, print the
basic_auth snippet with its hash (and the user's role and queues, when given).

From a terminal the password is read twice without echo (getpass); from a
pipe, one line of stdin (so scripts can make configs).  Nothing is written
to disk: the operator pastes the snippet into config/config.json.
"""

from __future__ import annotations

import getpass
import json
import sys
from typing import Any

from rqsys.web.auth import hash_password


def read_password() -> str | None:
    """The password, or None (with a line on stderr) when it is empty or mistyped."""
    if sys.stdin.isatty():
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Again: "):
            print("rqsys passwd: the passwords differ", file=sys.stderr)
            return None
    else:
        first = sys.stdin.readline().rstrip("\r\n")
    if not first:
        print("rqsys passwd: empty password", file=sys.stderr)
        return None
    return first


def main(user: str, role: str | None = None, queues: list[str] | None = None) -> int:
    password = read_password()
    if password is None:
        return 1
    entry: str | dict[str, Any] = hash_password(password)
    if role or queues:  # else the plain hash: an admin of every queue
        entry = {"password": entry, "role": role or "admin",
                 **({"queues": queues} if queues else {})}
    snippet = {"basic_auth": {"realm": "rqsys", "users": {user: entry}}}
    print(json.dumps(snippet, indent=2))
    return 0
