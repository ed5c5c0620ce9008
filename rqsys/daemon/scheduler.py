"""The in-memory que of one queue: which message runs next (priority, due
time, arrival), blocking keys and coalescing.

Two heaps: messages not yet due wait in ``_heap`` by due time; once due they
move to ``_ready``, ordered by ``priority`` (smaller first, default 0, as
Oban and Solid Queue), then due time, then arrival (the id's time stamp and
counter: ``rqsys.store.layout.arrival``), so messages sent together run in
the order sent.  A message that is
not due never holds back one that is, whatever their priorities.  The order
is strict: a due message of a better priority always starts first, so a
steady stream of them can starve worse ones (no ageing: what a user asks
for is what runs; give work that must not wait behind others its own queue).
With every priority 0 the order is the one without priorities: due time,
then id.

A due message its gate holds (``rqsys.daemon.gates``: concurrency, blocking
params, rate limit) or that waits for other messages (``after``) is parked
under a wait key; one parked message of a key goes back to the ready heap
each time the key may have room (an end, a start leaving room, the rate
window's next opening, kept in ``_timed`` and returned by ``next_due``).

A due message its gate lets start but that does not fit the queue's room
(``rqsys.daemon.room``: slots, budget) is parked under its need; each pop
tries again one message of every need that fits now (a handful of distinct
needs, whatever the que's length).  Smaller messages pass it meanwhile —
a message that cannot fit yet does not hold back one that can — but only
for ``reserve_after`` seconds (ageing): then the que is *reserved* for the
longest-waiting need, and nothing of another need starts until one of it
has started, so a big message is not starved by a stream of small ones.  A
need that cannot fit the idle queue (a reload shrank it) is never reserved
for: it waits without blocking anything.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from rqsys import tunables
from rqsys.daemon.gates import Gate, WaitKey, Wake
from rqsys.daemon.room import ONE, Need, Room, need_of
from rqsys.daemon.runorder import Ready, RunOrder
from rqsys.message import due_time, param_key
from rqsys.store.layout import arrival

Msg = dict[str, Any]
PLAIN = (0, 0.0)  # the run key's priority and due time of a plain message


def priority(msg: Msg) -> int:
    return int(msg.get("priority") or 0)


def run_key(msg_id: str, msg: Msg) -> Ready:
    return priority(msg), due_time(msg), arrival(msg_id), msg_id


class Schedule:
    """Queued messages, popped best priority then oldest-due first, honouring
    the queue's gate and the messages' dependencies.

    The heap may hold stale entries (deleted or re-timed messages); they are
    skipped when popped, so every operation stays O(log n).
    """

    def __init__(self, blocking: list[int], coalesce: list[int], gate: Gate | None = None,
                 room: Room | None = None, reserve_after: float = 60.0) -> None:
        self.coalesce = list(coalesce)
        self.gate = gate or Gate.from_config({"blocking_params": blocking})
        self.room = room or Room({"num_workers": 1 << 30})
        self.reserve_after = reserve_after
        self._room_keys: dict[WaitKey, list[Ready]] = {}  # ("f", need) -> its parked heap
        self._awake: dict[WaitKey, str] = {}  # such a key -> its message competing now
        self._needs: dict[str, Need] = {}  # id -> its need, when not one slot alone
        self._quiet: tuple[int, Need | None] | None = None  # (room.grown, reserved) when
        # a look for room woke nothing: nothing more can fit until one of them changes
        self._held_since: dict[str, float] = {}  # id -> when it first did not fit
        self._waiting: list[tuple[float, str]] = []  # (held since, id): oldest first
        self.msgs: dict[str, Msg] = {}
        self._heap: list[tuple[float, str]] = []  # not due yet when pushed: (due, id)
        self._ready: list[Ready] = []  # due
        self._parked: dict[WaitKey, list[Ready]] = defaultdict(list)  # heaps
        self._timed: list[tuple[float, WaitKey]] = []  # when a parked key may try again
        self._woken: dict[str, WaitKey] = {}  # id -> the key it was woken from, until popped
        self.after: set[str] = set()  # ids waiting for other messages (rqsys.daemon.after)
        self._by_coalesce: dict[tuple[str, ...], set[str]] = defaultdict(set)
        self._order = RunOrder(self._live_ready)  # the que tab's listing, sorted once asked
        self.plain = 0  # messages of priority 0 and no due time (rqsys.daemon.quetail)
        self.behind_tail = False  # plain messages wait in the tail: none after them starts
        self.tail_hit = False  # a pop met one that sorts after them: the tail is read first

    def __len__(self) -> int:
        return len(self.msgs)

    def __contains__(self, msg_id: str) -> bool:
        return msg_id in self.msgs

    def backlog(self) -> bool:
        """Whether messages wait for a worker now, in a queue of at least
        FORK_SERVER_MIN_WORKERS: more are due than workers are free, as of
        the last pop (an entry a change made stale since, or one its gate
        will hold, is counted until the next pop drops it: the count errs
        towards the fork server).  The fork server's ``auto`` test."""
        return (self.room.total_slots >= tunables.FORK_SERVER_MIN_WORKERS
                and len(self._ready) > self.room.free()[0])

    def add(self, msg_id: str, msg: Msg) -> None:
        if msg_id in self.msgs or msg_id in self._woken:  # not at start: 100,000 calls saved
            self.remove(msg_id)
        self.msgs[msg_id] = msg
        if self._order.built:
            self._order.add(run_key(msg_id, msg))
        if not (msg.get("priority") or msg.get("due")):
            self.plain += 1
        heapq.heappush(self._heap, (due_time(msg), msg_id))
        key = param_key(msg, self.coalesce)
        if key is not None:
            self._by_coalesce[key].add(msg_id)

    def remove(self, msg_id: str) -> Msg | None:
        woken = self._woken.pop(msg_id, None)
        if woken is not None:  # removed before its turn: the next of its key takes it
            self._awake.pop(woken, None)
            self._wake_one(woken)
        msg = self.msgs.pop(msg_id, None)
        self._held_since.pop(msg_id, None)
        self._needs.pop(msg_id, None)
        if msg is not None:
            self._order.removed()
            if not (msg.get("priority") or msg.get("due")):
                self.plain -= 1
            key = param_key(msg, self.coalesce)
            if key is not None:
                self._by_coalesce[key].discard(msg_id)
        return msg

    def _live(self, entry: tuple[float, str]) -> bool:
        msg = self.msgs.get(entry[1])
        return msg is not None and due_time(msg) == entry[0]

    def _live_ready(self, entry: Ready) -> bool:
        msg = self.msgs.get(entry[3])
        return msg is not None and (priority(msg), due_time(msg)) == entry[:2]

    def next_due(self) -> float | None:
        """The earliest due time of a runnable entry, or None."""
        self._wake_room(self._reserved(time.time()))  # room may have come free (an end)
        while self._ready and not self._live_ready(self._ready[0]):
            heapq.heappop(self._ready)
        while self._heap and not self._live(self._heap[0]):
            heapq.heappop(self._heap)
        while self._timed and not self._parked.get(self._timed[0][1]):
            heapq.heappop(self._timed)
        dues = ([entry[1] for entry in self._ready[:1]] + [entry[0] for entry in self._heap[:1]]
                + [entry[0] for entry in self._timed[:1]])
        return min(dues) if dues else None

    def _promote(self, now: float) -> None:
        """Entries due by ``now`` move to the ready heap (priority order), and
        so does one parked entry of each key whose time has come."""
        while self._heap and self._heap[0][0] <= now:
            due, msg_id = heapq.heappop(self._heap)
            if self._live((due, msg_id)):
                heapq.heappush(self._ready,
                               run_key(msg_id, self.msgs[msg_id]))
        while self._timed and self._timed[0][0] <= now:
            self._wake_one(heapq.heappop(self._timed)[1])

    def pop_ready(self, now: float) -> tuple[str, Msg] | None:
        """The next due message its gate lets start, removed from the que
        (``started`` is the caller's to say once it runs)."""
        self._promote(now)
        reserved = self._reserved(now)
        self._wake_room(reserved)
        while self._ready or self._wake_room(reserved):
            entry = heapq.heappop(self._ready)
            if not self._live_ready(entry):
                continue
            if self.behind_tail and entry[:2] > PLAIN:  # the tail's plain ones go first
                heapq.heappush(self._ready, entry)
                self.tail_hit = True
                return None
            msg_id = entry[3]
            woken = self._woken.pop(msg_id, None)
            if woken is not None and self._awake.pop(woken, None) is not None:
                self._quiet = None  # its need may compete again
            held = self._hold(msg_id, now)
            if held is not None:
                self._park(entry, *held)
                continue
            need = self._need_of(msg_id)
            if not self.room.fits(need) or (reserved is not None and need != reserved):
                self._park_for_room(entry, need, now)
                continue
            msg = self.remove(msg_id)
            assert msg is not None
            return msg_id, msg
        return None

    def _park_for_room(self, entry: Ready, need: Need, now: float) -> None:
        key = ("f", need)
        self._park(entry, key, None)
        self._room_keys[key] = self._parked[key]  # the same heap: no look-up when scanned
        msg_id = entry[3]
        if msg_id not in self._held_since and not self.room.fits(need):
            self._held_since[msg_id] = now
            heapq.heappush(self._waiting, (now, msg_id))

    def _wake_room(self, reserved: Need | None) -> bool:
        """The best message waiting for room whose need fits now (the
        reserved need's, while the que is reserved) competes again, unless
        one of its need competes already; whether one was woken."""
        stamp = (self.room.grown, reserved)
        if stamp == self._quiet or not self._room_keys:
            return False
        best: tuple[Ready, WaitKey] | None = None
        slots, memory, cpus, gpus = self.room.free()  # Room.fits, inlined: ~100 needs a call
        for key, parked in list(self._room_keys.items()):
            need = key[1]
            if not parked:  # emptied (and dropped from _parked by _wake_one)
                del self._room_keys[key]
            elif need[0] <= slots and need[1] <= memory and need[2] <= cpus \
                    and need[3] <= gpus and key not in self._awake \
                    and (reserved is None or need == reserved) \
                    and (best is None or parked[0] < best[0]):
                best = parked[0], key
        if best is None:
            self._quiet = stamp
            return False
        self._wake_one(best[1])
        return True

    def _need_of(self, msg_id: str) -> Need:
        need = self._needs.get(msg_id)
        if need is None:
            need = need_of(self.msgs[msg_id])
            if need is not ONE:  # a plain message's is found as fast as looked up
                self._needs[msg_id] = need
        return need

    def _reserved(self, now: float) -> Need | None:
        """The need the que is reserved for: the longest-waiting one's, once it
        has waited ``reserve_after`` seconds, unless it cannot ever fit."""
        while self._waiting:
            since, msg_id = self._waiting[0]
            if self._held_since.get(msg_id) != since:
                heapq.heappop(self._waiting)  # started, removed, or held again since
                continue
            if now - since < self.reserve_after:
                return None
            need = self._need_of(msg_id)
            if self.room.ever_fits(need):
                return need
            heapq.heappop(self._waiting)  # waits without blocking the others
            del self._held_since[msg_id]
        return None

    def _hold(self, msg_id: str, now: float) -> Wake | None:
        if msg_id in self.after:
            return ("a", msg_id), None
        return self.gate.hold(self.msgs[msg_id], now)

    def _park(self, entry: Ready, key: WaitKey, when: float | None) -> None:
        heapq.heappush(self._parked[key], entry)
        if when is not None:
            heapq.heappush(self._timed, (when, key))

    def _wake_one(self, key: WaitKey) -> None:
        """The best live entry parked under ``key`` competes again."""
        parked = self._parked.get(key)
        while parked:
            entry = heapq.heappop(parked)
            if self._live_ready(entry):
                heapq.heappush(self._ready, entry)
                self._woken[entry[3]] = key
                if key[0] == "f":
                    self._awake[key] = entry[3]
                break
        if not parked:
            self._parked.pop(key, None)

    def _wake(self, wakes: list[Wake]) -> None:
        for key, when in wakes:
            if key not in self._parked:
                continue
            if when is None:
                self._wake_one(key)
            else:
                heapq.heappush(self._timed, (when, key))

    def started(self, msg_id: str, msg: Msg, now: float) -> list[str]:
        """``msg_id`` runs: its gate counts it and its share of the room is
        held; the GPU ids it holds."""
        self._wake(self.gate.started(msg, now))
        return self.room.take(msg_id, need_of(msg))

    def ended(self, msg_id: str, msg: Msg) -> None:
        """``msg_id`` no longer runs: a message held by its keys or waiting
        for room may start."""
        self.room.give(msg_id)
        self._wake(self.gate.ended(msg))

    def dropped(self, msg: Msg) -> None:
        """A popped ``msg`` that will not run (its directory was removed by
        hand): what its start and end would have woken is woken, so the
        messages parked behind its keys are not left waiting for it."""
        self._wake(self.gate.started(msg, None))
        self._wake(self.gate.ended(msg))

    def unhold(self, msg_id: str) -> None:
        """``msg_id`` no longer waits for other messages."""
        self.after.discard(msg_id)
        self._wake_one(("a", msg_id))

    def reconfigure(self, gate: Gate, coalesce: list[int], running: Iterable[Msg],
                    config: dict[str, Any]) -> None:
        """A reload: a new gate (the running messages counted in it, rate
        windows kept) and room; every parked message competes again."""
        gate.adopt(self.gate)
        self.gate, self.coalesce = gate, list(coalesce)
        self.room.configure(config)
        self.reserve_after = float(config.get("reserve_after", 60))
        for msg in running:
            gate.started(msg, None)
        for key in [k for k in self._parked if k[0] != "a"]:
            for entry in self._parked.pop(key):
                heapq.heappush(self._ready, entry)
        self._awake.clear()  # each need's parked messages are all in the ready heap now
        self._room_keys.clear()

    def take_coalesced(self, msg: Msg) -> list[tuple[str, Msg]]:
        """Remove and return the queued messages with ``msg``'s coalesce key,
        whatever their due time (RQ's ``handle_dups``)."""
        key = param_key(msg, self.coalesce)
        if key is None:
            return []
        taken = []
        for msg_id in sorted(self._by_coalesce.pop(key, ()), key=lambda i: (arrival(i), i)):
            if msg_id in self.after:  # still waiting for other messages: it runs on its own
                self._by_coalesce[key].add(msg_id)
                continue
            found = self.remove(msg_id)
            if found is not None:
                taken.append((msg_id, found))
        return taken

    def find_same_params(self, msg: Msg) -> str | None:
        """A queued message with the same dest and params (for single_que)."""
        want = param_key(msg, [1, 2, 3, 4])
        for msg_id, other in self.msgs.items():
            if other.get("dest") == msg.get("dest") and param_key(other, [1, 2, 3, 4]) == want:
                return msg_id
        return None

    def ordered_ids(self, offset: int = 0, limit: int | None = None) -> list[str]:
        """Queued ids by priority, due time and arrival: the order they start in
        when due and no gate holds them (``rqsys.daemon.runorder``)."""
        return self._order.ids(lambda: (run_key(i, msg) for i, msg in self.msgs.items()),
                               offset, limit)
