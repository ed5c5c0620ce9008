"""A lone client's small enqueue served on waitress's main thread, without a thread hand-off.

waitress parses a request on its main thread and hands it to a worker
thread: a condition-variable wake-up, the GIL passed between the two
threads, and on a busy machine a wait for the woken thread to be scheduled.
For one keep-alive client enqueueing (``POST .../new_message``) that
hand-off is a quarter of rq-web's CPU per request (432 -> 324 µs measured),
while the main thread has nothing else to do meanwhile.

So the main thread runs such a request itself, but only when doing so can
keep no other client waiting (:meth:`InlineChannel.may_run_inline`):

* this connection is the server's only one, so no other connection's
  reading or writing waits: only the accepting of a new one, which the
  kernel's backlog holds until the request ends;
* no task waits for a worker thread;
* the request is a complete POST to a ``new_message`` route with a small
  body already read (its work is one round trip to a queue daemon, its
  answer a few hundred bytes, so writing it never waits for the main thread
  to flush: that wait would deadlock here).

Any other request, and every request while a second connection is open,
goes to the worker threads as before.  The answer, its order on the
connection and the channel's bookkeeping are waitress's own
(``HTTPChannel.service``), on another thread.
"""

from __future__ import annotations

from typing import Any

from waitress.server import BaseWSGIServer

from rqsys.web.onewrite import OneWriteChannel

INLINE_MAX_BODY = 64 << 10  # bytes of request body an inline request may carry
INLINE_SUFFIX = "/new_message"


class InlineChannel(OneWriteChannel):
    """A channel whose lone small enqueue runs on the main thread (see module doc)."""

    reading = False  # in handle_read: a task it adds may be kept for the main thread
    inline_due = False  # a task was kept: run it when handle_read is done

    def handle_read(self) -> None:
        self.reading = True
        try:
            super().handle_read()
        finally:
            self.reading = False
        if self.inline_due:
            # after received() has let go of requests_lock, which service() takes
            self.inline_due = False
            self.service()

    def may_run_inline(self) -> bool:
        """Only a lone connection's small enqueue, with no task waiting for a worker.

        A worker may still be ending this connection's previous request (its
        answer sent, its request popped): waitress itself starts the next one
        on another worker then."""
        if not self.reading or len(self.server.active_channels) != 1:
            return False
        if self.server.task_dispatcher.queue:
            return False
        request = self.requests[0]
        return bool(request.command == "POST" and not request.error
                    and request.path.endswith(INLINE_SUFFIX)
                    and request.content_length <= INLINE_MAX_BODY
                    and not request.expect_continue)


def inline_add_task(add_task: Any) -> Any:
    """The server's ``add_task``, which keeps a task for the main thread when
    its :class:`InlineChannel` may run it there."""
    def add(channel: Any) -> None:
        if isinstance(channel, InlineChannel) and channel.may_run_inline():
            channel.inline_due = True
        else:
            add_task(channel)

    return add


def use_inline(server: Any) -> None:
    """Make every listening server in ``server``'s map start InlineChannels."""
    for obj in list((getattr(server, "map", None) or server._map).values()):
        if isinstance(obj, BaseWSGIServer):
            obj.channel_class = InlineChannel
            obj.add_task = inline_add_task(obj.add_task)
