"""One kept-alive HTTP/1.1 connection: a request out in one write, its answer read.

``http.client`` parses every answer's headers with the ``email`` package and
writes a request's head and body separately: a quarter of a millisecond and a
few syscalls a request, a good part of a relay worker's CPU for a small
message (three requests).  A relay's requests are small form posts, JSON gets
and attachment uploads, so this reads the status line, the headers that frame
the body (``Content-Length``, ``Transfer-Encoding``, ``Connection``) and the
body, and nothing else.  Plain sockets; ``https`` through ``ssl`` as
``http.client`` would (the default context: certificates and host name checked).
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

MAX_HEAD = 64 * 1024  # bytes of status line and headers
MAX_BODY = 64 * 1024 * 1024  # an answer is RQ JSON: a bigger one is no peer of ours
NO_BODY = (204, 304)


class Closed(ConnectionError):
    """The far end closed the connection before a whole answer came."""


class BadAnswer(ValueError):
    """What came back is not an HTTP/1.x answer this client can read."""


class HTTPConn:
    """A connection to ``host:port``, opened on the first request."""

    def __init__(self, scheme: str, host: str, port: int | None, timeout: float) -> None:
        self.https = scheme == "https"
        self.host, self.timeout = host, timeout
        self.port = port or (443 if self.https else 80)
        default = (self.https and self.port == 443) or (not self.https and self.port == 80)
        name = f"[{host}]" if ":" in host else host
        self.host_header = name if default else f"{name}:{self.port}"
        self.sock: socket.socket | None = None
        self.buf = bytearray()
        self.used = False  # an answer came on it: a failure now may be a stale keep-alive

    def connect(self) -> socket.socket:
        if self.sock is None:
            sock = socket.create_connection((self.host, self.port), self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.https:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
            else:
                kernel_timeouts(sock, self.timeout)
            self.sock = sock
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None

    def head(self, method: str, target: str, headers: dict[str, str],
             length: int | None) -> bytes:
        """The request's head (``Content-Length`` when it has a body)."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def request(self, method: str, target: str, headers: dict[str, str],
                body: bytes | None) -> tuple[int, bytes, bool]:
        """(status, body, whether the far end closes the connection after it)."""
        length = len(body) if body is not None else (0 if method == "POST" else None)
        try:
            self.connect().sendall(self.head(method, target, headers, length) + (body or b""))
        except BlockingIOError:  # SO_SNDTIMEO ran out
            raise TimeoutError("timed out") from None
        return self.answer(method)

    def send_file(self, src: Any) -> None:
        """Stream an open file on the connection (``sendfile(2)``; send for TLS),
        timed out by Python (``socket.sendfile`` waits for ever on a kernel timeout)."""
        sock = self.connect()
        sock.settimeout(self.timeout)
        try:
            sock.sendfile(src)
        finally:
            if not self.https:  # back to the kernel's timeouts for the kept-alive rest
                sock.settimeout(None)

    def answer(self, method: str) -> tuple[int, bytes, bool]:
        while True:
            version, status, fields = self.read_head()
            if not 100 <= status < 200:
                break  # 1xx (100 Continue) come before the real answer
        close = fields.get("connection", "").lower()
        will_close = close == "close" or (version == "HTTP/1.0" and close != "keep-alive")
        if method == "HEAD" or status in NO_BODY:
            body = b""
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            body = self.read_chunked()
        elif "content-length" in fields:
            body = self.read_exactly(content_length(fields["content-length"]))
        else:
            body, will_close = self.read_to_close(), True
        self.used = True
        return status, body, will_close

    def read_head(self) -> tuple[str, int, dict[str, str]]:
        end = self.fill_until(b"\r\n\r\n", MAX_HEAD)
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[:end + 4]
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not (code.isascii() and code.isdigit()):
            raise BadAnswer(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        return version, int(code), fields

    def read_chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            end = self.fill_until(b"\r\n", MAX_HEAD)
            size_text = bytes(self.buf[:end]).split(b";", 1)[0].strip()
            del self.buf[:end + 2]
            try:
                size = int(size_text, 16)
            except ValueError:
                raise BadAnswer(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                self.skip_trailers()
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise BadAnswer(f"answer longer than {MAX_BODY} bytes")
            parts.append(self.read_exactly(size))
            self.read_exactly(2)  # the chunk's CRLF

    def skip_trailers(self) -> None:
        while True:
            end = self.fill_until(b"\r\n", MAX_HEAD)
            del self.buf[:end + 2]
            if end == 0:
                return

    def read_exactly(self, size: int) -> bytes:
        while len(self.buf) < size:
            self.recv_some()
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data

    def read_to_close(self) -> bytes:
        try:
            while len(self.buf) <= MAX_BODY:
                self.recv_some()
        except Closed:
            data = bytes(self.buf)
            self.buf.clear()
            return data
        raise BadAnswer(f"answer longer than {MAX_BODY} bytes")

    def fill_until(self, mark: bytes, limit: int) -> int:
        """Read until ``mark`` is in the buffer; its offset."""
        while True:
            at = self.buf.find(mark)
            if at >= 0:
                return at
            if len(self.buf) > limit:
                raise BadAnswer(f"no {mark!r} in the first {limit} bytes of the answer")
            self.recv_some()

    def recv_some(self) -> None:
        assert self.sock is not None
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:  # SO_RCVTIMEO ran out
            raise TimeoutError("timed out") from None
        if not data:
            raise Closed("the far end closed the connection")
        self.buf += data


def kernel_timeouts(sock: socket.socket, timeout: float) -> None:
    """Make ``sock`` blocking, timed out by the kernel (SO_RCVTIMEO, SO_SNDTIMEO):
    with a Python timeout every recv and send is a poll first, two syscalls and,
    in the relay worker, two hand-overs of the GIL between its threads."""
    seconds = max(timeout, 0.001)
    tv = struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    sock.settimeout(None)


def content_length(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_BODY:
        raise BadAnswer(f"bad Content-Length {text[:20]!r}")
    return int(text)
