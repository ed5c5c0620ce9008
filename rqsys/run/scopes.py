"""Transient scopes for script runs, through systemd's D-Bus API (jeepney).

A run with limits is moved into ``rq-msg-<queue>-<id>.scope`` with
StartTransientUnit (its PID, MemoryMax=, CPUQuota=, TasksMax=); at its end
the scope is stopped, which kills whatever the script left behind (double
forks, setsid children), and its Result says whether the OOM killer ended
it.  Every call here blocks until systemd has done the job, so only a
background lane's thread calls them, never the daemon's loop.  jeepney is
pure Python and speaks the wire protocol itself: no libdbus, no GLib loop.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

from rqsys.errors import RQError
from rqsys.run import resources

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
CALL_TIMEOUT = 30.0  # seconds for one call, and for a job to be done
SYSTEM_BUS = "/run/dbus/system_bus_socket"
NO_VALUE = (1 << 64) - 1  # systemd's "[not set]": no accounting for it here


class ScopeError(RQError):
    """systemd did not make, stop or describe a run's scope."""


def available() -> bool:
    """Whether a systemd manager may be reachable on the system bus."""
    from rqsys import systemd

    return systemd.booted() and os.path.exists(SYSTEM_BUS)


def scope_prefix(queue: str) -> str:
    return f"rq-msg-{queue}-"


def scope_name(queue: str, msg_id: str) -> str:
    return f"{scope_prefix(queue)}{msg_id}.scope"


def properties(pid: int, limits: dict[str, Any], stop_grace: float) -> list[tuple[str, Any]]:
    """StartTransientUnit's properties for a run: its pid and its limits."""
    props: list[tuple[str, Any]] = [
        ("PIDs", ("au", [pid])),
        # stop: TERM everything, then KILL after stop_grace (default 90 s)
        ("TimeoutStopUSec", ("t", int(stop_grace * 1_000_000))),
    ]
    if "memory_max" in limits:
        props.append(("MemoryMax", ("t", resources.size_bytes(limits["memory_max"]))))
    if "cpu_quota" in limits:
        usec = resources.quota_percent(limits["cpu_quota"]) * 10_000
        props.append(("CPUQuotaPerSecUSec", ("t", usec)))
    if "tasks_max" in limits:
        props.append(("TasksMax", ("t", int(limits["tasks_max"]))))
    return props


class Systemd:
    """One D-Bus connection to systemd, made at first use (on the calling thread)."""

    def __init__(self) -> None:
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None:
            from jeepney import MatchRule
            from jeepney.bus_messages import message_bus
            from jeepney.io.blocking import open_dbus_connection

            try:
                conn = open_dbus_connection(bus="SYSTEM")
            except (OSError, ValueError) as exc:
                raise ScopeError(f"cannot reach the system bus: {exc}") from exc
            # the bus matches the sender's well-known name; the local filter
            # sees only its unique name, so it leaves the sender out
            self._jobs_rule = MatchRule(type="signal", interface=_iface(),
                                        member="JobRemoved", path=MANAGER_PATH)
            on_bus = MatchRule(type="signal", sender=SYSTEMD, interface=_iface(),
                               member="JobRemoved", path=MANAGER_PATH)
            conn.send_and_get_reply(message_bus.AddMatch(on_bus), timeout=CALL_TIMEOUT)
            self._conn = conn
            self._call("Subscribe", "", ())  # systemd signals job ends to subscribers
        return self._conn

    def _call(self, method: str, signature: str, body: tuple[Any, ...],
              path: str = MANAGER_PATH, interface: str = "") -> tuple[Any, ...]:
        from jeepney import DBusAddress, MessageType, new_method_call
        from jeepney.low_level import HeaderFields

        address = DBusAddress(path, bus_name=SYSTEMD, interface=interface or _iface())
        reply = self._connection().send_and_get_reply(
            new_method_call(address, method, signature or None, body), timeout=CALL_TIMEOUT)
        if reply.header.message_type == MessageType.error:
            name = reply.header.fields.get(HeaderFields.error_name, "")
            why = reply.body[0] if reply.body else ""
            raise ScopeError(f"{method}: {why or name}", ) from None
        return tuple(reply.body)

    def _job(self, method: str, signature: str, body: tuple[Any, ...]) -> str:
        """Call a method that queues a job; its result once systemd has done it."""
        conn = self._connection()
        with conn.filter(self._jobs_rule, queue=deque()) as removed:
            (job,) = self._call(method, signature, body)
            while True:
                _id, path, _unit, result = conn.recv_until_filtered(
                    removed, timeout=CALL_TIMEOUT).body
                if path == job:
                    return str(result)

    def start(self, name: str, props: list[tuple[str, Any]]) -> None:
        """Make scope ``name`` with ``props`` (its PIDs among them) and wait until it runs."""
        result = self._job("StartTransientUnit", "ssa(sv)a(sa(sv))", (name, "fail", props, []))
        if result != "done":
            raise ScopeError(f"scope {name} did not start ({result})")

    def stop(self, name: str) -> str:
        """Stop scope ``name`` (every process in it is killed) and return its Result
        (``oom-kill`` when the OOM killer ended it); '' when it had gone already."""
        try:
            self._job("StopUnit", "ss", (name, "replace"))
            result = str(self.scope_property(name, "Result"))
        except ScopeError as exc:
            if "not loaded" in str(exc) or "NoSuchUnit" in str(exc):
                return ""  # every process had ended: systemd has collected it
            raise
        if result != "success":
            self._call("ResetFailedUnit", "s", (name,))  # or it stays, failed, for ever
        return result

    def scope_property(self, name: str, prop: str) -> Any:
        (path,) = self._call("GetUnit", "s", (name,))
        (value,) = self._call("Get", "ss", (f"{SYSTEMD}.Scope", prop), path=path,
                              interface="org.freedesktop.DBus.Properties")
        return value[1]  # a variant: (signature, value)

    def memory_controlled(self, name: str) -> bool:
        """Whether systemd accounts (so limits) the memory of scope ``name``."""
        return self.scope_property(name, "MemoryCurrent") != NO_VALUE

    def stop_all(self, prefix: str) -> list[str]:
        """Stop every loaded scope whose name starts with ``prefix``; their names."""
        (units,) = self._call("ListUnitsByPatterns", "asas", ([], [f"{prefix}*.scope"]))
        names = [unit[0] for unit in units]
        for name in names:
            self.stop(name)
        return names


def _iface() -> str:
    return f"{SYSTEMD}.Manager"
