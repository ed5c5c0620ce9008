"""Framing of the queue-socket protocol, shared by the daemon and its clients.

The protocol (unix stream socket, ``/run/rq/<q>.sock`` or ``<root>/sock/<q>.sock``):

* A request is one JSON object on one line: ``{"op": "<name>", ...}\\n``.
  Open files (attachments) travel with the line as ``SCM_RIGHTS`` ancillary
  data of the same ``sendmsg``.
* The answer is one JSON line: ``{"ok": true, ...}`` or
  ``{"ok": false, "error": "<why>", "kind": "<error class>"}``.
* One request at a time per connection (send, read the answer, repeat); a
  connection may carry any number of requests.  Requests sent ahead are
  answered in order: the daemon takes up a connection's next request only
  after it has answered the one before.
* ``create`` is answered once the message is durable; a request carrying
  files (``attach``, ``create`` with attachments) once they are checked
  against their MD5, which the daemon does on a thread of its own.
* A line longer than MAX_LINE, or one that is not a JSON object, is answered
  with an error and the connection is closed; the daemon never dies of it.
* A request holding NaN or Infinity, or a string with a lone UTF-16
  surrogate, is answered with a ``BadRequest`` (``decode_request``).
* A request that does not match its operation's JSON Schema is answered with
  a ``BadRequest`` naming the field; a bug in the daemon with an
  ``InternalError`` (and logged); the connection goes on in both cases.

The operations are the table in ``rqsys.daemon.ops``; the shape of each
request is its schema in ``rqsys.wire.schema``.
"""

from __future__ import annotations

import array
import json
import math
import re
import socket
from typing import Any

from rqsys import errors
from rqsys.errors import BadRequest, ProtocolError, TooLarge

MAX_LINE = 8 << 20
MAX_FDS = 64
_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps makes one a call


class LineTooLong(TooLarge):
    """A request over MAX_LINE: not sent (the daemon would refuse it whole)."""


def encode(obj: dict[str, Any]) -> bytes:
    return _ENCODE(obj).encode() + b"\n"


def encode_request(obj: dict[str, Any]) -> bytes:
    """A request line, or LineTooLong when the daemon could not take it."""
    line = encode(obj)
    if len(line) > MAX_LINE:
        raise LineTooLong(f"request of {len(line)} bytes is over the line limit of {MAX_LINE}")
    return line


def decode(line: bytes, parse_constant: Any = None, parse_float: Any = None) -> dict[str, Any]:
    try:
        obj = json.loads(line, parse_constant=parse_constant, parse_float=parse_float)
    except ValueError as exc:
        raise ProtocolError(f"request is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ProtocolError("request is not a JSON object")
    return obj


def decode_request(line: bytes) -> dict[str, Any]:
    """A request line, refused (``BadRequest``) when it holds what no message
    may: NaN or Infinity (not JSON: a ``due`` of NaN never came), or a lone
    UTF-16 surrogate (``"\\ud800"``: text no file or exec can carry; its
    message's start raised, every time the daemon came back).  A surrogate
    pair is one character once parsed: only a line with such an escape is walked."""
    obj = decode(line, _refuse_constant, _finite)
    if _SURROGATE.search(line) and not _is_text(obj):
        raise BadRequest("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                         "which is not text")
    return obj


# a surrogate's escape, or its bytes (json.loads takes them with surrogatepass)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _refuse_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number's float, refused when too large for one (1e999 was inf)."""
    number = float(text)
    if not math.isfinite(number):
        raise BadRequest(f"{text[:40]} is out of range for a number")
    return number


def _is_text(value: Any) -> bool:
    """No string in ``value`` (keys too) holds a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_is_text(k) and _is_text(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_text(item) for item in value)
    return True


def error_reply(exc: Exception) -> dict[str, Any]:
    kind = type(exc).__name__ if isinstance(exc, errors.RQError) else "RQError"
    return {"ok": False, "error": str(exc), "kind": kind}


def raise_for(reply: dict[str, Any]) -> dict[str, Any]:
    """Return an ok reply; raise the matching RQError for an error reply."""
    if reply.get("ok"):
        return reply
    cls = getattr(errors, str(reply.get("kind")), errors.RQError)
    if not (isinstance(cls, type) and issubclass(cls, errors.RQError)):
        cls = errors.RQError
    raise cls(str(reply.get("error", "unknown error")))


def send(sock: socket.socket, data: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send ``data`` whole, with ``fds`` attached to its first part."""
    if fds:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sent = sock.sendmsg([data], anc)
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv(sock: socket.socket, size: int = 65536) -> tuple[bytes, list[int]]:
    """One recvmsg: the bytes and any file descriptors that came with them."""
    data, anc, _flags, _addr = sock.recvmsg(size, _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    return data, fds


class LineBuffer:
    """Accumulates bytes and fds from a stream; yields complete request lines."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.fds: list[int] = []

    def feed(self, data: bytes, fds: list[int]) -> None:
        self.buf += data
        self.fds.extend(fds)
        if len(self.buf) > MAX_LINE and b"\n" not in self.buf:
            raise ProtocolError(f"request line longer than {MAX_LINE} bytes")

    def next_line(self) -> tuple[bytes, list[int]] | None:
        end = self.buf.find(b"\n")
        if end < 0:
            return None
        line = bytes(self.buf[:end])
        del self.buf[: end + 1]
        fds, self.fds = self.fds, []
        return line, fds
