"""Runs in sub-cgroups of the queue daemon's own delegated cgroup: make, limit, kill, account.

systemd's delegation contract (https://systemd.io/CGROUP_DELEGATION/):
a unit with ``Delegate=yes`` owns the cgroup subtree below its own cgroup,
and may make, limit and kill sub-cgroups there as it likes; systemd keeps
the unit's own limits (``MemoryMax=`` of rq@<q>.service) over all of it.
So no privilege is needed: rq-scan renders ``Delegate=yes`` into the
drop-in of a queue with ``message_limits``, and its daemon (user rq)

- moves itself into the leaf ``daemon`` (cgroup v2 lets only a cgroup
  without processes of its own hand controllers to its children),
- enables the memory, cpu and pids controllers it was given below it,
- runs each limited script in ``msg-<id>`` (memory.max, cpu.max,
  pids.max), moved there through the gate before it execs,
- at the run's end kills the whole sub-cgroup (``cgroup.kill``), waits
  until it is empty, reads its accounting and removes it.

Every call here touches only cgroupfs (no disk), but :meth:`Delegation.stop`
waits for processes to die: only a background lane calls these.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rqsys.errors import RQError
from rqsys.run import resources

MOUNTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))  # unified, or hybrid's v2
CONTROLLERS = ("memory", "cpu", "pids")
DAEMON_LEAF = "daemon"
# systemd starts processes in the unit's own cgroup (ExecReload='s kill): enabling
# the controllers then fails (EBUSY) until they are moved or gone; tried again
ENABLE_TRIES, ENABLE_PAUSE = 50, 0.1
RUN_PREFIX = "msg-"
EMPTY_TIMEOUT = 30.0  # seconds for a killed sub-cgroup to empty
CPU_PERIOD_US = 100_000
DELEGATED_ENV = "RQ_CGROUP_DELEGATED"


class CgroupError(RQError):
    """A run's sub-cgroup could not be made, limited or removed."""


@dataclass
class Usage:
    """What a run's sub-cgroup accounted (None: not accounted here)."""

    oom_kills: int = 0
    memory_peak_kb: int | None = None
    cpu_s: float | None = None
    tasks_peak: int | None = None

    def fields(self) -> dict[str, Any]:
        found = {"RQ_MEMORY_PEAK_KB": self.memory_peak_kb, "RQ_CPU_S": self.cpu_s,
                 "RQ_TASKS_PEAK": self.tasks_peak, "RQ_OOM_KILLS": self.oom_kills}
        return {key: value for key, value in found.items() if value is not None}


def own_cgroup(proc_text: str | None = None) -> Path | None:
    """This process's cgroup v2 directory, or None (no cgroup v2 mounted here)."""
    if proc_text is None:
        proc_text = Path("/proc/self/cgroup").read_text()
    rel = next((line[3:] for line in proc_text.splitlines() if line.startswith("0::")), None)
    if rel is None or rel.startswith("/.."):  # outside our cgroup namespace's root
        return None
    for mount in MOUNTS:
        if (mount / "cgroup.controllers").exists():
            return mount / rel.lstrip("/")
    return None


def delegated(path: Path) -> bool:
    """Whether systemd delegated ``path`` to us: it says so in an xattr
    (systemd >= 251), and (for a User= service) has given us its files."""
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, name) == b"1":
                return _writable(path)
    return os.geteuid() != 0 and path.stat().st_uid == os.geteuid() and _writable(path)


def _writable(path: Path) -> bool:
    """ProtectControlGroups=yes mounts cgroupfs read-only: then not."""
    return all(os.access(p, os.W_OK) for p in
               (path, path / "cgroup.procs", path / "cgroup.subtree_control"))


def find() -> tuple[Delegation | None, str]:
    """The delegated cgroup of this daemon, or None and why not ("" when the
    unit does not delegate).  Only where the unit says it delegates
    (RQ_CGROUP_DELEGATED=1, from rq-scan's drop-in): a daemon started from
    a shell of a desktop session has a cgroup its user owns (the user's
    systemd made it), but not one to rearrange."""
    if os.environ.get(DELEGATED_ENV) != "1":
        return None, ""
    try:
        path = own_cgroup()
        if path is None:
            return None, "no cgroup v2 line in /proc/self/cgroup, or no cgroup v2 mounted"
        if not delegated(path):
            return None, (f"{path} has no delegate xattr (nor, for a User= service, "
                          f"is it owned by uid {os.geteuid()}), or is not writable")
        return Delegation(path), ""
    except OSError as exc:
        return None, f"cannot read the cgroup: {exc}"


def oom_kills(path: Path | None) -> int:
    """How many processes of cgroup ``path`` (its subtree) the OOM killer has killed."""
    return _keyed(_read(path / "memory.events")).get("oom_kill", 0) if path else 0


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # the controller is not enabled here: not accounted
        return ""


def _keyed(text: str) -> dict[str, int]:
    """``usage_usec 123\\n...`` -> {"usage_usec": 123, ...}."""
    pairs = (line.split() for line in text.splitlines())
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


class Delegation:
    """The daemon's delegated cgroup and its runs' sub-cgroups."""

    def __init__(self, unit: Path) -> None:
        self.unit = unit
        self.controllers: set[str] = set()

    def setup(self) -> list[str]:
        """Move this daemon's processes into the leaf, kill the runs a previous
        daemon left, enable the controllers; the names of those runs."""
        leaf = self.unit / DAEMON_LEAF
        leaf.mkdir(exist_ok=True)
        self._move_in(leaf)
        stale = sorted(p.name for p in self.unit.iterdir()
                       if p.name.startswith(RUN_PREFIX) and p.is_dir())
        for name in stale:
            self._remove(self.unit / name)
        given = _read(self.unit / "cgroup.controllers").split()
        wanted = [c for c in CONTROLLERS if c in given]
        for attempt in range(ENABLE_TRIES) if wanted else ():
            try:
                _write(self.unit / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
                break
            except OSError as exc:  # EBUSY: a process joined the unit meanwhile (ExecReload=)
                if exc.errno != errno.EBUSY or attempt == ENABLE_TRIES - 1:
                    raise
                time.sleep(ENABLE_PAUSE)
                self._move_in(leaf)
        self.controllers = set(wanted)
        return stale

    def _move_in(self, leaf: Path) -> None:
        """Every process in the unit's own cgroup into ``leaf``: a cgroup with
        processes of its own cannot give controllers to its children."""
        for pid in _read(self.unit / "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError):  # it has just exited
                _write(leaf / "cgroup.procs", pid)

    def run_path(self, msg_id: str) -> Path:
        return self.unit / f"{RUN_PREFIX}{msg_id}"

    def start(self, msg_id: str, pid: int, limits: dict[str, Any]) -> None:
        """Make run ``msg_id``'s sub-cgroup with ``limits`` and move ``pid`` in."""
        path = self.run_path(msg_id)
        try:
            path.mkdir()
            for name, value in self.limit_files(limits).items():
                _write(path / name, value)
            _write(path / "cgroup.procs", str(pid))
        except OSError as exc:
            raise CgroupError(f"cannot make {path}: {exc}") from exc

    def limit_files(self, limits: dict[str, Any]) -> dict[str, str]:
        """The files of a run's sub-cgroup that hold ``limits`` (of the
        controllers enabled here)."""
        files: dict[str, str] = {}
        if "memory_max" in limits and "memory" in self.controllers:
            size = resources.size_bytes(limits["memory_max"])
            files["memory.max"] = str(size)  # as MemoryMax=: swap is not capped
        if "cpu_quota" in limits and "cpu" in self.controllers:
            quota = resources.quota_percent(limits["cpu_quota"]) * CPU_PERIOD_US // 100
            files["cpu.max"] = f"{quota} {CPU_PERIOD_US}"
        if "tasks_max" in limits and "pids" in self.controllers:
            files["pids.max"] = str(int(limits["tasks_max"]))
        return files

    def holds(self, key: str) -> bool:
        """Whether limit ``key`` is held by the kernel here."""
        need = {"memory_max": "memory", "cpu_quota": "cpu", "tasks_max": "pids"}.get(key)
        return need is None or need in self.controllers

    def stop(self, msg_id: str) -> Usage:
        """Kill everything left in run ``msg_id``'s sub-cgroup, wait until it
        is empty, and remove it; what it used."""
        return self._remove(self.run_path(msg_id))

    def _remove(self, path: Path) -> Usage:
        if not path.exists():
            return Usage()
        try:
            _write(path / "cgroup.kill", "1")
        except OSError as exc:  # before Linux 5.14: no cgroup.kill
            raise CgroupError(f"cannot kill {path}: {exc}") from exc
        _wait_empty(path)
        usage = _usage(path)
        try:
            path.rmdir()
        except OSError as exc:
            raise CgroupError(f"cannot remove {path}: {exc}") from exc
        return usage


def _wait_empty(path: Path) -> None:
    deadline, pause = time.monotonic() + EMPTY_TIMEOUT, 0.001
    while "populated 1" in _read(path / "cgroup.events"):
        if time.monotonic() > deadline:
            raise CgroupError(f"{path} still has processes {EMPTY_TIMEOUT:g} s after cgroup.kill")
        time.sleep(pause)  # on a lane's thread; SIGKILLed processes go within ms
        pause = min(pause * 2, 0.05)


def _usage(path: Path) -> Usage:
    usage = Usage(oom_kills=_keyed(_read(path / "memory.events")).get("oom_kill", 0))
    peak = _read(path / "memory.peak").strip()
    usage.memory_peak_kb = int(peak) // 1024 if peak.isdigit() else None
    cpu = _keyed(_read(path / "cpu.stat")).get("usage_usec")
    usage.cpu_s = round(cpu / 1e6, 3) if cpu is not None else None
    tasks = (_read(path / "pids.peak") or "").strip()
    usage.tasks_peak = int(tasks) if tasks.isdigit() else None
    return usage
