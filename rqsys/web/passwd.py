"""``rqsys passwd [USER]``: read a password, print the basic_auth snippet with its hash.

From a terminal the password is read twice without echo (getpass); from a
pipe, one line of stdin (so scripts can make configs).  Nothing is written
to disk: the operator pastes the snippet into config/config.json.
"""

from __future__ import annotations

import getpass
import json
import sys

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


def main(user: str) -> int:
    password = read_password()
    if password is None:
        return 1
    snippet = {"basic_auth": {"realm": "rqsys", "users": {user: hash_password(password)}}}
    print(json.dumps(snippet, indent=2))
    return 0
