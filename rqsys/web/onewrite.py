"""Waitress answers sent whole by the thread that made them: head and body in one write.

Waitress writes a response's status line and headers, then its body, as two
``write_soon`` calls.  With its default of flushing each write at once, a
small answer leaves in two TCP segments (TCP_NODELAY is on), and RQ clients
that read an answer with one ``read()`` (RQ's own ``mime_test.rb`` does) may
get the headers only.  Buffering the writes instead (``send_bytes``) leaves
the sending to waitress's main thread after the task ends: one more thread
wake-up, and on a busy machine about a third of an HTTP enqueue's time.
Here the task joins the head to the first piece of the body and writes them
as one, so the task's own thread sends a small answer whole at once; larger
bodies (downloads) still stream after it.

After each request waitress's worker thread also wakes the main thread
(its trigger pipe: a write, a read and one more ``select``), so that the
main thread, which stopped reading the connection while the request ran,
reads it again.  With a lookahead of one request
(``channel_request_lookahead``) the main thread never stopped reading it;
a request that ends with its answer sent, the connection open and nothing
else queued changes nothing the main thread waits for, so the wake-up is
skipped (:func:`quiet_trigger`): on a keep-alive enqueue that is two system
calls and a thread switch of each request's few.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer
from waitress.task import WSGITask


class OneWriteTask(WSGITask):  # type: ignore[misc]
    """A WSGI task whose head goes out with the first piece of the body."""

    wrote_header: bool

    def write(self, data: bytes) -> None:
        if self.wrote_header or not data or not self.complete or not self.has_body \
                or self.chunked_response or self.content_length is None:
            super().write(data)
            return
        head = self.build_response_header()
        self.wrote_header = True
        body = data[: self.content_length - self.content_bytes_written]
        self.content_bytes_written += len(body)
        self.channel.write_soon(head + body)


LOOKAHEAD = 1  # requests read ahead on a connection while one runs (see quiet_trigger)
_serving = threading.local()  # the channel a worker thread is serving, if any


class OneWriteChannel(HTTPChannel):  # type: ignore[misc]
    task_class = OneWriteTask

    def service(self) -> None:
        _serving.channel = self
        try:
            super().service()
        finally:
            _serving.channel = None

    def settled(self) -> bool:
        """Nothing for the main thread to notice: still open, reading (the
        lookahead), nothing left to send or to start."""
        return (self.connected and self.adj.channel_request_lookahead >= 1
                and not (self.will_close or self.close_when_flushed
                         or self.total_outbufs_len or self.requests))


def quiet_trigger(pull: Callable[[], None]) -> Callable[[], None]:
    """The server's ``pull_trigger``, skipped at the end of a request whose
    channel is :meth:`OneWriteChannel.settled`."""
    def pull_trigger() -> None:
        channel = getattr(_serving, "channel", None)
        if channel is None or not channel.settled():
            pull()

    return pull_trigger


def use_one_write(server: Any) -> None:
    """Make every listening server in ``server``'s map start OneWriteChannels
    and wake its main thread only when a channel needs it."""
    for obj in list((getattr(server, "map", None) or server._map).values()):
        if isinstance(obj, BaseWSGIServer):
            obj.channel_class = OneWriteChannel
            obj.pull_trigger = quiet_trigger(obj.pull_trigger)
