"""Resource limits of queues and runs: parsing, tightening, and systemd's words for them.

A queue's ``limits`` become a drop-in for ``rq@<queue>.service``; its
``message_limits`` (with a message's own ``limits``, which may only
tighten them) become the properties of each run's transient scope, or
rlimits where there is no systemd.  The JSON Schema has checked the
syntax already (``2G``, ``150%``); this module turns it into numbers.
(Not to be confused with the sizes of message fields: ``rqsys.message``.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
DROP_IN_NAME = "50-rqsys-limits.conf"
# config key -> (unit file setting, how the value is written there)
QUEUE_SETTINGS = (("memory_max", "MemoryMax"), ("cpu_quota", "CPUQuota"),
                  ("tasks_max", "TasksMax"), ("io_weight", "IOWeight"))
RUN_KEYS = ("memory_max", "cpu_quota", "tasks_max", "runtime_max")


def size_bytes(text: str) -> int:
    """``2G`` -> 2147483648 (K, M, G, T are powers of 1024)."""
    suffix = text[-1:] if text[-1:] in SUFFIX and not text[-1:].isdigit() else ""
    return int(text[:-1] if suffix else text) * SUFFIX[suffix]


def quota_percent(text: str) -> int:
    """``150%`` -> 150."""
    return int(text.rstrip("%"))


# A queue with message_limits: its daemon gets its cgroup subtree (rqsys.run.cgroups),
# writable (ProtectControlGroups=yes would mount cgroupfs read-only), and is told
# so (a cgroup the user owns is not always one delegated to this daemon).
DELEGATE = ("Delegate=memory cpu pids", "ProtectControlGroups=no",
            "Environment=RQ_CGROUP_DELEGATED=1")


def limits_runs(cfg: dict[str, Any]) -> bool:
    """Whether a queue limits its runs: ``message_limits``, or a budget of
    memory or CPUs (each run's needs become its limits); its daemon gets a
    delegated cgroup subtree for them."""
    budget = cfg.get("budget") or {}
    return bool(cfg.get("message_limits") or "memory" in budget or "cpus" in budget)


def drop_in(limits: dict[str, Any] | None, delegate: bool = False) -> str:
    """The drop-in text for a queue's ``limits`` (and, with ``delegate``, its
    ``message_limits``); '' when there are none."""
    lines = [f"{setting}={limits[key]}" for key, setting in QUEUE_SETTINGS
             if limits and key in limits]
    lines += DELEGATE if delegate else ()
    if not lines:
        return ""
    return ("# Made by rq-scan from the queue's config.json \"limits\" and "
            "\"message_limits\";\n# rewritten or removed with them.\n[Service]\n"
            + "\n".join(lines) + "\n")


def _number(key: str, value: Any) -> float:
    if key == "memory_max":
        return size_bytes(value)
    if key == "cpu_quota":
        return quota_percent(value)
    return float(value)


def run_limits(queue: dict[str, Any] | None, message: dict[str, Any] | None) -> dict[str, Any]:
    """A run's limits: the queue's ``message_limits``, each tightened (never
    loosened) by the message's own ``limits``."""
    merged = dict(queue or {})
    for key, value in (message or {}).items():
        if key not in merged or _number(key, value) < _number(key, merged[key]):
            merged[key] = value
    return {key: merged[key] for key in RUN_KEYS if key in merged}


def describe_memory(limits: dict[str, Any]) -> str:
    """``limit 2G`` for a reason text."""
    return f"limit {limits['memory_max']}"


def runtime_text(seconds: float) -> str:
    """``600`` -> ``600 s``; ``0.5`` -> ``0.5 s``."""
    return f"{seconds:g} s"


def drop_in_path(unit_dir: Path, queue: str, name: str = DROP_IN_NAME) -> Path:
    return unit_dir / f"rq@{queue}.service.d" / name


def drop_in_text(unit_dir: Path, queue: str, name: str) -> str:
    """What queue ``queue``'s drop-in ``name`` says now ('' when there is none)."""
    try:
        return drop_in_path(unit_dir, queue, name).read_text()
    except FileNotFoundError:
        return ""


def delegates(unit_dir: Path, queue: str) -> bool:
    """Whether queue ``queue``'s drop-in hands its cgroup to its daemon now."""
    try:
        return DELEGATE[0] in drop_in_path(unit_dir, queue).read_text()
    except FileNotFoundError:
        return False


def sync_drop_in(unit_dir: Path, queue: str, limits: dict[str, Any] | None,
                 delegate: bool = False) -> bool:
    """Write (or remove) queue ``queue``'s limits drop-in; True when it changed,
    so systemd must reload its units."""
    return write_drop_in(drop_in_path(unit_dir, queue), drop_in(limits, delegate))


def write_drop_in(path: Path, text: str) -> bool:
    """Make the drop-in ``path`` say ``text`` (remove it for ''); True when it
    changed.  Also the credentials' (``rqsys.run.credentials``)."""
    try:
        old = path.read_text()
    except FileNotFoundError:
        old = ""
    if old == text:
        return False
    if not text:
        path.unlink()
        with contextlib.suppress(OSError):  # not empty: another drop-in of the operator's
            path.parent.rmdir()
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # systemd never reads half a file (unit config, not message data)
    return True


def room_text(usage: dict[str, Any]) -> str:
    """``slots 3/4, memory 12G/48G, cpus 4/16, gpus 0 of 0,1``: what the running
    messages hold of a queue's slots and budget (``rqsys.daemon.room.Room.usage``)."""
    parts = [f"slots {usage['slots']['used']}/{usage['slots']['total']}"]
    if "memory" in usage:
        parts.append(f"memory {_size(usage['memory']['used'])}/{_size(usage['memory']['total'])}")
    if "cpus" in usage:
        parts.append(f"cpus {usage['cpus']['used']:g}/{usage['cpus']['total']:g}")
    if "gpus" in usage:
        held = ",".join(usage["gpus"]["used"]) or "none"
        parts.append(f"gpus {held} of {','.join(usage['gpus']['total'])}")
    return ", ".join(parts)


def _size(value: float) -> str:
    for suffix in ("T", "G", "M", "K"):
        if value >= SUFFIX[suffix]:
            return f"{value / SUFFIX[suffix]:.3g}{suffix}"
    return f"{value:.0f}"
