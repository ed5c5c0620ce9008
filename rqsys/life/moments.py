"""The named moments of a message's life and of its daemon's loop, and each moment's hooks.

A feature is an object whose methods are named ``on_<moment>`` for the
moments it uses (dramatiq's middleware shape): ``Moments.register`` adds each
such method to that moment's hooks, once, when the queue is built from its
config.  The
daemon's rooms call a moment's hooks where the moment happens; a queue that
uses no optional feature has empty lists there, and a message pays nothing
for a feature it does not use.  Features never call one another: they meet
at the moments.

A message's life (where each is called):

    creating(msg)                       intake: a client's new message, before it is staged
    staged(msg_id, msg, origin)         intake: staged under its id (not durable yet)
    placed(msg_id, msg, state)          transitions: new → que | prep, durable
    queued(msg_id, msg)                 transitions: in the que (placed or committed)
    starting(msg_id, msg, run_env)      run: its script's environment is being made
    duplicating(src_id, copy)           run: a running script's dup is made (features add to it)
    run_over(msg_id, outcome, worker)   run: its run is over (worker None: never began)
    ended(msg_id, state)                ledger: in done, err or relayed
    removed(msg_id)                     ledger: gone (deleted, pruned, removed by hand)

The loop's (``rqsys.daemon.loop``):

    joining(selector)                   start-up, before READY=1 (may refuse: RQError)
    building_ops(table, schemas)        the socket's op table is being made
    turn()                              each loop turn, before due messages start
    wait() -> float | None              seconds until the feature needs a turn
    busy() -> bool                      whether the feature keeps an idle daemon up
    diverting(msg, state, src_id, then) -> bool
                                        intake: a clone or a dup here; True when the
                                        feature took it (a pool queue's go to the pool)
    closing()                           the daemon stops, after the store's last flush

Record-keeping features (timelines, statistics, the search index, failure
groups, batch ends) follow the log's events instead: each is an ``EventLog``
sink told only the kinds it listens to (``rqsys.observe.events.listening``).
"""

from __future__ import annotations

import selectors
from collections.abc import Callable
from typing import Any

Msg = dict[str, Any]
Copied = Callable[[str, BaseException | None], None]  # (new id, error)

LIFE = ("creating", "staged", "placed", "queued", "starting", "duplicating", "run_over",
        "ended", "removed")
LOOP = ("joining", "building_ops", "turn", "wait", "busy", "diverting", "closing")


class Moments:
    """Each named moment's hooks, in the order their features were registered."""

    def __init__(self) -> None:
        self.creating: list[Callable[[Msg], None]] = []
        self.staged: list[Callable[[str, Msg, str], None]] = []
        self.placed: list[Callable[[str, Msg, str], None]] = []
        self.queued: list[Callable[[str, Msg], None]] = []
        self.starting: list[Callable[[str, Msg, dict[str, str]], None]] = []
        self.duplicating: list[Callable[[str, Msg], None]] = []
        self.run_over: list[Callable[[str, Any, Any], None]] = []
        self.ended: list[Callable[[str, str], None]] = []
        self.removed: list[Callable[[str], None]] = []
        self.joining: list[Callable[[selectors.BaseSelector], None]] = []
        self.building_ops: list[Callable[[dict[str, Any], dict[str, Any]], None]] = []
        self.turn: list[Callable[[], None]] = []
        self.wait: list[Callable[[], float | None]] = []
        self.busy: list[Callable[[], bool]] = []
        self.diverting: list[Callable[[Msg, str, str, Copied], bool]] = []
        self.closing: list[Callable[[], None]] = []
        self.features: list[str] = []  # the names of the features registered, in order

    def register(self, feature: object, name: str = "") -> None:
        """Add each of ``feature``'s ``on_<moment>`` methods to that moment's hooks."""
        used = [moment for moment in (*LIFE, *LOOP)
                if callable(getattr(feature, f"on_{moment}", None))]
        if not used:
            raise TypeError(f"{type(feature).__name__} uses no moment of a message's life")
        for moment in used:
            getattr(self, moment).append(getattr(feature, f"on_{moment}"))
        self.features.append(name or type(feature).__name__)

    def unregister(self, feature: object, name: str = "") -> None:
        """Take ``feature``'s hooks out again (a feature whose work is over: a
        start's reading of que/)."""
        for moment in (*LIFE, *LOOP):  # new lists: a loop going through one keeps it whole
            setattr(self, moment, [h for h in getattr(self, moment)
                                   if getattr(h, "__self__", None) is not feature])
        if (name or type(feature).__name__) in self.features:
            self.features.remove(name or type(feature).__name__)

    def uses(self, moment: str) -> list[str]:
        """The names of the hooks of ``moment`` (ARCHITECTURE.md's table, a test's check)."""
        return [getattr(hook, "__qualname__", repr(hook)) for hook in getattr(self, moment)]
