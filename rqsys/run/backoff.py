"""Automatic retries of failed runs: the queue's ``retry`` policy and its back-off.

Off unless the queue's config has a ``retry`` object or the message a
``retry_max`` (RQ's behaviour otherwise: a failure goes to ``err``).  A run
that failed for a reason the policy names in ``on`` (``err``: the script
said so; ``exit``: it exited non-zero, or 0 without ``done``; ``signal``: a
signal ended it; ``timeout``: its timeout did) goes back to ``que`` with
``due`` set to the back-off, its ``retries`` field one higher, and the
status ``retry 2 of 5 in 40 s: <reason>``; once ``max`` retries were made,
the next failure goes to ``err`` as without a policy, ``(after N retries)``
added to its status.  A ``resend`` from the script is not a failure and is
not counted here (it counts toward ``max_count`` as in RQ).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from rqsys.run.verdict import Outcome

RETRIES = "retries"  # msg field: automatic retries made so far
REASONS = ("err", "exit", "signal", "timeout")
DEFAULTS: dict[str, Any] = {  # what a retry object (or a bare retry_max) leaves out
    "on": list(REASONS), "max": 3, "backoff": "exponential", "base": 10, "cap": 3600,
    "jitter": False}
MAX_DOUBLINGS = 60  # 2**60 times any base is over any cap: no float overflow


def policy(msg: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The retry policy for ``msg`` in this queue (None: no retries)."""
    spec, mine = cfg.get("retry"), msg.get("retry_max")
    if spec is None and mine is None:
        return None
    found = {**DEFAULTS, **(spec or {})}
    if mine is not None:
        found["max"] = int(mine)
    return found


def delay(pol: dict[str, Any], attempt: int,
          rand: Callable[[], float] = random.random) -> float:
    """Seconds before retry number ``attempt`` (1 for the first)."""
    base, kind = float(pol["base"]), pol["backoff"]
    if kind == "exponential":
        raw = base * 2 ** min(attempt - 1, MAX_DOUBLINGS)
    elif kind == "linear":
        raw = base * attempt
    else:
        raw = base
    wait = min(raw, float(pol["cap"]))
    if pol["jitter"]:  # "equal jitter": at least half the back-off, at random up to all
        wait = wait / 2 + rand() * wait / 2
    return wait


def retried(outcome: Outcome, msg: dict[str, Any], cfg: dict[str, Any]) -> Outcome:
    """``outcome`` of a run, or the retry that replaces a failure."""
    pol = policy(msg, cfg) if outcome.state == "err" and outcome.kind else None
    if pol is None or outcome.kind not in pol["on"]:
        return outcome
    made = int(msg.get(RETRIES) or 0)
    if made >= pol["max"]:
        if made:
            outcome.text += f" (after {made} retr{'y' if made == 1 else 'ies'})"
        return outcome
    wait = delay(pol, made + 1)
    text = f"retry {made + 1} of {pol['max']} in {wait:.0f} s: {outcome.text}"
    return Outcome("que", text, delay=wait, kind="retry",
                   fields={**outcome.fields, RETRIES: made + 1},
                   last_line=outcome.last_line, tail=outcome.tail)  # this attempt's
