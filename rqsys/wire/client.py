"""Talking to a queue daemon over its socket (used by the web, CLI, scan, relay)."""

from __future__ import annotations

import socket
import struct
from typing import Any
from urllib.parse import urlsplit

from rqsys.errors import BadRequest, NotFound, NotSent, Unavailable
from rqsys.message import is_remote, split_message_url
from rqsys.special import RELAY_QUEUE
from rqsys.store import Layout, QueueStore, check_msg_id, check_queue_name
from rqsys.wire import framing


class QueueClient:
    """A connection to one queue daemon; one request at a time."""

    def __init__(self, layout: Layout, queue: str, timeout: float = 30.0) -> None:
        self.queue = check_queue_name(queue)
        self.layout = layout
        self.path = layout.socket_path(queue)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._lines = framing.LineBuffer()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.settimeout(None)  # blocking, whatever socket.setdefaulttimeout said
            kernel_timeouts(sock, self.timeout)
            try:
                sock.connect(str(self.path))
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                if not self.layout.queue_dir(self.queue).is_dir():
                    raise NotFound(f"no queue named {self.queue}") from exc
                raise Unavailable(f"queue {self.queue} is not running ({self.path}: "
                                  f"{exc.strerror})") from exc
            self._sock = sock
        return self._sock

    def call(self, op: str, fds: list[int] | tuple[int, ...] = (), **args: Any) -> dict[str, Any]:
        """Send one request and return its ok answer (errors are raised)."""
        line = framing.encode_request({"op": op, **args})
        sock = self._connect()
        try:
            framing.send(sock, line, fds)
        except OSError as exc:  # a daemon that closes a connection reads no part line
            self.close()
            raise NotSent(f"queue {self.queue}: {exc.strerror or exc}") from exc
        try:
            return framing.raise_for(framing.decode(self._read_line(sock)))
        except (OSError, framing.ProtocolError) as exc:
            self.close()
            if isinstance(exc, framing.ProtocolError):
                raise
            why = "timed out" if isinstance(exc, BlockingIOError) else exc  # kernel_timeouts
            raise Unavailable(f"queue {self.queue}: {why}") from exc

    def open_stream(self, op: str, **args: Any) -> socket.socket:
        """Send a request whose answers keep coming (``watch``): the connection
        is the caller's from then on, to read (``framing.LineBuffer``) and close."""
        sock = self._connect()
        self._sock = None
        try:
            framing.send(sock, framing.encode({"op": op, **args}))
            kernel_timeouts(sock, 0.0)  # the caller's settimeout() rules from here on
            sock.settimeout(self.timeout)
        except OSError as exc:
            sock.close()
            raise Unavailable(f"queue {self.queue}: {exc}") from exc
        return sock

    def _read_line(self, sock: socket.socket) -> bytes:
        while True:
            got = self._lines.next_line()
            if got is not None:
                return got[0]
            data, _fds = framing.recv(sock)
            if not data:
                raise ConnectionResetError("queue daemon closed the connection")
            self._lines.feed(data, [])


def kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Time out a blocking socket's sends and receives in the kernel
    (SO_SNDTIMEO, SO_RCVTIMEO; 0: never), which then raise BlockingIOError.

    Python's ``settimeout`` polls the socket before every send and receive:
    two more system calls a request, each handing the GIL over, which in
    rq-web's threads costs more than the calls themselves.
    """
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)


def split_queue_url(url: str) -> str:
    """``http://host:port/root/q/<queue>`` -> queue name."""
    parts = [p for p in urlsplit(url).path.split("/") if p]
    if len(parts) < 2 or parts[-2] != "q":
        raise BadRequest(f"not a queue URL: {url!r}")
    return check_queue_name(parts[-1])


def is_local_url(url: str, sysconfig: dict[str, Any]) -> bool:
    """True when ``url`` names this rqsys (same host, port and root)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    local_hosts = {str(sysconfig["host"]), "localhost", "127.0.0.1"}
    return (parts.hostname in local_hosts and port == int(sysconfig["port"])
            and parts.path.startswith(sysconfig["relative_root"]))


def queue_for_dest(dest: str, force_remote: bool = False) -> str:
    """RQ's rule for a new message: any URL dest (this host's too) goes to the relay
    queue, which delivers it over HTTP; a name is that local queue."""
    if is_remote(dest) or force_remote:
        return RELAY_QUEUE
    return check_queue_name(dest)


def local_queue_of(url: str, sysconfig: dict[str, Any]) -> str | None:
    """The queue a URL names when it names one of this rqsys's queues, else None
    (a queue accepts a message whose dest is its own URL, as RQ's web does)."""
    if not is_remote(url) or not is_local_url(url, sysconfig):
        return None
    return split_queue_url(url)


def find_message(layout: Layout, msg_ref: str, queue: str | None = None) -> tuple[str, str]:
    """(queue, id) from a full message URL, or a short id searched in the queues.

    Short ids are unique within a queue only; one found in two queues is
    refused (the full URL names the queue).
    """
    if is_remote(msg_ref):
        return split_message_url(msg_ref)
    msg_id = check_msg_id(msg_ref)
    found = [name for name in ([queue] if queue else layout.queue_names())
             if _holds(layout, name, msg_id)]
    if not found:
        raise NotFound(f"no message {msg_id} in any queue")
    if len(found) > 1:
        raise BadRequest(f"message id {msg_id} is in queues {', '.join(found)}: "
                         "give the full message URL")
    return found[0], msg_id


def _holds(layout: Layout, queue: str, msg_id: str) -> bool:
    try:
        QueueStore(layout.queue_dir(queue)).find(msg_id)
    except NotFound:
        return False
    return True
