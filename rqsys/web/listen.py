"""Where the web front end listens, and whether it may listen there without a password.

Loopback is the default (config ``addr``: 127.0.0.1).  A non-loopback
address is refused unless ``basic_auth`` is configured, or the operator says
``--allow-unauthenticated-network`` (config ``allow_unauthenticated_network``),
in which case every start logs a warning: anyone who reaches the port can
enqueue, and so run scripts.  This module imports no web framework: the
embedded supervisor uses it before it binds.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from rqsys.errors import ConfigError

ALLOW_FLAG = "--allow-unauthenticated-network"


def parse_listen(text: str) -> tuple[str, int]:
    """``ADDR:PORT``, ``[V6ADDR]:PORT`` or ``:PORT`` -> (addr, port); ConfigError otherwise."""
    if text.startswith("["):
        addr, sep, port = text[1:].partition("]:")
    else:
        addr, sep, port = text.rpartition(":")
        if ":" in addr:
            raise ConfigError(f"--listen {text!r}: write an IPv6 address as [ADDR]:PORT")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen {text!r}: expected ADDR:PORT (say 127.0.0.1:3333 "
                          "or [::1]:3333), the port 1..65535")
    return addr or "127.0.0.1", int(port)


def is_loopback(addr: str) -> bool:
    """127.0.0.0/8, ::1 (and v4-mapped loopback); a name or a wildcard is not."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return addr == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def bound_address(sock: socket.socket) -> str | None:
    """The address a TCP socket is bound to (None for a unix socket: no network)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return str(sock.getsockname()[0])


def check_exposure(addr: str | None, sysconfig: dict[str, Any], allow: bool = False) -> str:
    """ConfigError when ``addr`` is reachable from the network without a password;
    the warning to log at start when the operator allowed it, else ""."""
    if addr is None or is_loopback(addr) or sysconfig.get("basic_auth") is not None:
        return ""
    if not (allow or sysconfig.get("allow_unauthenticated_network")):
        raise ConfigError(
            f"refusing to serve the web on {addr}, a non-loopback address, without "
            f"basic_auth: anyone who reaches it could run scripts; configure basic_auth "
            f"(see rqsys passwd) or pass {ALLOW_FLAG}")
    return (f"warning: serving the web on {addr} without authentication "
            f"({ALLOW_FLAG}): anyone who reaches it can enqueue, delete and run scripts")


def format_address(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
