"""DNS rebinding: a request must name this server in its ``Host`` header.

A page on another site can point its own DNS name at 127.0.0.1 once the
page has loaded; the operator's browser then sends that page's requests to
this server, as same-origin requests of the attacker's name: every
same-origin check passes, and without ``basic_auth`` every route answers.
What gives it away is the ``Host`` header, which names the attacker's
domain.  A browser's request (one that carries ``Sec-Fetch-*`` or ``Origin``,
as every current browser's does) whose Host is a DNS name is served only when
the name is this server's: the config's ``host`` (the name in message URLs),
this machine's host name, ``localhost``, or one of
``allowed_hosts``; others are answered 421.  An IP address passes (it cannot
be rebound), and so do requests not from a browser (curl, RQ's clients,
relay peers and other hosts' dependency checks, which may use any name of
this host), and signed webhooks (``exempt``: ``rqsys.web.auth.signed_hook``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import falcon


class KnownHost:
    """falcon middleware: 421 for a request that names another host."""

    def __init__(self, sysconfig: dict[str, Any],
                 exempt: Callable[[falcon.Request], bool] | None = None) -> None:
        self.exempt = exempt
        names = [sysconfig.get("host"), socket.gethostname(), "localhost",  # no DNS asked
                 *(sysconfig.get("allowed_hosts") or [])]
        self.names = frozenset(str(name).lower().rstrip(".") for name in names if name)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not (req.get_header("Sec-Fetch-Site") or req.get_header("Sec-Fetch-Mode")
                or req.get_header("Origin")) or (self.exempt is not None and self.exempt(req)):
            return  # not a browser: no page can have rebound its name; or signed
        host = req.get_header("Host") or ""
        name = host_name(host)
        if name and not _is_address(name) and name not in self.names:
            raise falcon.HTTPError(
                falcon.HTTP_421, title="not this server's name",
                description=f"Host {host[:100]!r} is not a name of this server: add it to "
                            "allowed_hosts in config.json if it is")


def host_name(host: str) -> str:
    """``h.example:3333`` -> ``h.example``; ``[::1]:3333`` -> ``::1``."""
    try:
        return (urlsplit(f"//{host.strip()}").hostname or "").rstrip(".")
    except ValueError:
        return host.strip().lower()  # unparsable: not a name of ours


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
