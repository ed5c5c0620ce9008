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
"""

from __future__ import annotations

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


class OneWriteChannel(HTTPChannel):  # type: ignore[misc]
    task_class = OneWriteTask


def use_one_write(server: Any) -> None:
    """Make every listening server in ``server``'s map start OneWriteChannels."""
    for obj in list((getattr(server, "map", None) or server._map).values()):
        if isinstance(obj, BaseWSGIServer):
            obj.channel_class = OneWriteChannel
