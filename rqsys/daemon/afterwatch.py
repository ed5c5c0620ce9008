"""Following the dependencies a queue daemon cannot see itself, on one thread
of its own: a message of another local queue through that queue daemon's
``watch`` op (its end is pushed, never polled), a message on another host
by a bounded poll of its ``state.json`` through the relay's HTTP client.

The loop asks with ``follow(url)``; each message that reached a final state
(``done``, ``err``, ``relayed``, or ``gone``: deleted or unknown) comes back
through a pipe in the loop's selector (``take``).  Nothing here changes the
daemon's state: the thread only reads and reports.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import heapq
import itertools
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable

from rqsys.errors import BadRequest, NotFound, RQError, Unavailable
from rqsys.store import Layout
from rqsys.wire import framing
from rqsys.wire.client import QueueClient

FINAL = ("done", "err", "relayed", "gone")
POLL_FIRST, POLL_MAX = 1.0, 60.0  # a remote message's poll: doubling, at most a minute apart
RECONNECT = 1.0  # a local daemon that is restarting is asked again after this
HTTP_TIMEOUT = 10.0
Local = Callable[[str], "tuple[str, str] | None"]  # url -> (queue, id) on this host, or None
Ended = tuple[str, str, str]  # (url, final state, status)


class Follower:
    """One thread following URLs until each ends; ends reported to the loop."""

    def __init__(self, layout: Layout, local: Local) -> None:
        self.layout, self._local = layout, local
        self._asks: queue.SimpleQueue[tuple[str, float]] = queue.SimpleQueue()
        self._ended: collections.deque[Ended] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # to the loop
        self._ask_r, self._ask_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # to the thread
        self._timed: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._interval: dict[str, float] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rq-after", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the loop's side
    def fileno(self) -> int:
        return self._wake_r

    def follow(self, url: str, delay: float = 0.0) -> None:
        """Report ``url``'s end (looked at ``delay`` seconds from now)."""
        self._asks.put((url, delay))
        _poke(self._ask_w)

    def take(self) -> list[Ended]:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        taken = []
        while self._ended:
            taken.append(self._ended.popleft())
        return taken

    def close(self) -> None:
        """The thread ends at its next wake-up; the loop's end of the pipe closes now."""
        self._closed = True
        _poke(self._ask_w)
        os.close(self._wake_r)

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._ask_r, selectors.EVENT_READ, None)
        while not self._closed:
            wait = max(0.0, self._timed[0][0] - time.monotonic()) if self._timed else None
            for key, _mask in sel.select(wait):
                if key.data is None:
                    self._take_asks()
                else:
                    key.data(sel, key.fileobj)
            while self._timed and self._timed[0][0] <= time.monotonic():
                self._look(sel, heapq.heappop(self._timed)[2])
        sel.close()
        for fd in (self._ask_r, self._ask_w, self._wake_w):
            os.close(fd)

    def _take_asks(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._ask_r, 4096):
                pass
        while not self._asks.empty():
            url, delay = self._asks.get()
            self._later(url, delay)

    def _later(self, url: str, delay: float) -> None:
        heapq.heappush(self._timed, (time.monotonic() + delay, next(self._seq), url))

    def _report(self, url: str, state: str, status: str) -> None:
        self._ended.append((url, state, status))
        with contextlib.suppress(OSError):  # closed: the daemon is stopping
            _poke(self._wake_w)

    def _look(self, sel: selectors.BaseSelector, url: str) -> None:
        local = self._local(url)
        if local is None:
            self._poll(url)
        else:
            self._watch(sel, url, *local)

    # ------------------------------------------------------------ another local queue
    def _watch(self, sel: selectors.BaseSelector, url: str, queue_name: str, msg_id: str) -> None:
        try:
            sock = QueueClient(self.layout, queue_name, HTTP_TIMEOUT).open_stream(
                "watch", msg_id=msg_id)
        except NotFound as exc:
            self._report(url, "gone", str(exc))
            return
        except RQError:  # not running now (restarting): asked again soon
            self._later(url, RECONNECT)
            return
        sock.setblocking(False)
        lines = framing.LineBuffer()
        sel.register(sock, selectors.EVENT_READ,
                     lambda s, _f: self._read(s, sock, lines, url))

    def _read(self, sel: selectors.BaseSelector, sock: socket.socket, lines: framing.LineBuffer,
              url: str) -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the daemon went away before the message ended: ask again
            self._drop(sel, sock)
            self._later(url, RECONNECT)
            return
        lines.feed(data, [])
        while (got := lines.next_line()) is not None:
            if self._heard(url, framing.decode(got[0])):
                self._drop(sel, sock)
                return

    def _heard(self, url: str, reply: dict[str, object]) -> bool:
        """A line of the watch; True once the message has ended (or is unknown)."""
        if not reply.get("ok"):
            self._report(url, "gone", str(reply.get("error", "")))
            return True
        state = str(reply.get("state", ""))
        if state in FINAL:
            self._report(url, state, str(reply.get("status", "")))
            return True
        return False

    @staticmethod
    def _drop(sel: selectors.BaseSelector, sock: socket.socket) -> None:
        sel.unregister(sock)
        sock.close()

    # ------------------------------------------------------------ another host
    def _poll(self, url: str) -> None:
        from rqsys.scripts.rqhttp import Peer, PeerError, PeerUnknown  # the relay's client

        try:
            state = str(Peer(url, HTTP_TIMEOUT).get_json(f"{url}/state.json")[0])
        except PeerUnknown as exc:
            self._report(url, "gone", str(exc))
            return
        except (PeerError, RQError, LookupError, TypeError):
            state = ""  # unreachable or odd for now: asked again later
        if state in FINAL:
            self._interval.pop(url, None)
            self._report(url, state, _status_of(url) if state == "err" else "")
            return
        interval = min(POLL_MAX, self._interval.get(url, POLL_FIRST / 2) * 2)
        self._interval[url] = interval
        self._later(url, interval)


def _status_of(url: str) -> str:
    """A remote message's status line (why it failed), or "" when not told."""
    from rqsys.scripts.rqhttp import Peer

    try:
        return str(Peer(url, HTTP_TIMEOUT).get_json(f"{url}.json").get("status", ""))[:500]
    except (RQError, AttributeError):
        return ""


def _poke(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.write(fd, b"x")


def check_all(urls: list[str], deadline: float) -> None:
    """On a background thread: BadRequest unless the host of each URL knows
    it, Unavailable unless all answered by ``deadline`` (all asked at once)."""
    if deadline <= time.monotonic():  # the checks of creates before it took its time
        raise Unavailable("after: not checked in time (other creates' checks came first); "
                          "not created")
    pool = concurrent.futures.ThreadPoolExecutor(len(urls))
    try:
        asked = [pool.submit(check_remote, url, deadline) for url in urls]
        _done, late = concurrent.futures.wait(asked, max(0.0, deadline - time.monotonic()))
        if late:
            raise Unavailable(f"after: {len(late)} of {len(urls)} hosts did not answer in "
                              "time; not created")
        for answer in asked:
            answer.result()  # the first failure, in the order given
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a late one ends at its timeout


def check_remote(url: str, deadline: float) -> None:
    """BadRequest unless the host of ``url`` knows it (asked until ``deadline``)."""
    from rqsys.scripts.rqhttp import Peer, PeerError, PeerUnknown  # the relay's client

    try:
        Peer(url, max(0.1, min(HTTP_TIMEOUT, deadline - time.monotonic()))).get_json(
            f"{url}/state.json")
    except PeerUnknown as exc:
        raise BadRequest(f"after: no message {url} (its host says: {exc})") from exc
    except (PeerError, RQError) as exc:
        raise Unavailable(f"after: {url} could not be checked: {exc}") from exc


def refuse_after_in_pool(msg: object) -> None:
    """A pool queue's messages are on NATS, out of this daemon's sight."""
    if isinstance(msg, dict) and "after" in msg:
        raise BadRequest("after: not taken by a pool queue (its messages live on NATS)")
