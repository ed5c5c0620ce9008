"""What this host can run, said in the suite's first lines, so that a red log says why.

Each line names one real part the system tests use: the QEMU guests (KVM
or TCG, found by a probe boot), systemd-nspawn, the cgroup controllers the
host's own containers see, and journald.  Nothing here skips a test: under
``CI=true`` a test whose part is missing still fails (conftest.need).
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import nspawn
import qemu_vm


def lines(probes: bool = True) -> list[str]:
    """The report; ``probes``: boot a QEMU guest and ask nspawn (the system
    tests' parts: some seconds, up to a minute on a fresh host), else say
    they were not probed."""
    unprobed = "not probed (no system test selected)"
    return [f"host: {_cpu()}, kernel {platform.release()}",
            f"QEMU guests (power cuts, cgroup v2 limits): {_guests() if probes else unprobed}",
            "systemd-nspawn (booted systemd): "
            f"{(nspawn.can_boot() or 'yes') if probes else unprobed}",
            f"cgroups here: {_cgroups()}",
            f"journald: {_journald()}"]


def _cpu() -> str:
    info = Path("/proc/cpuinfo").read_text(errors="replace")
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                  if ln.startswith("model name")), platform.machine())
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                  if ln.startswith("flags")), [])
    extras = [f for f in ("amx_tile", "avx512f") if f in flags]
    return f"{model} ({os.cpu_count()} cores{', ' + ' '.join(extras) if extras else ''})"


def _guests() -> str:
    missing = qemu_vm.missing()
    if missing:
        return f"cannot boot: {missing}"
    try:
        return qemu_vm.accel_report()
    except qemu_vm.VMError as exc:
        return f"cannot boot: {exc}"


def _cgroups() -> str:
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists():
        return f"v2, controllers: {v2.read_text().strip() or 'none'}"
    v1 = sorted(p.name for p in Path("/sys/fs/cgroup").iterdir() if (p / "tasks").exists())
    return f"v1 ({', '.join(v1) or 'none'}); v2 limits are proved in the QEMU guest"


def _journald() -> str:
    if Path("/run/systemd/journal/socket").exists():
        return "running (its socket is there)"
    if shutil.which("systemd-journald") or Path("/lib/systemd/systemd-journald").exists():
        return "installed, not running here (the booted containers run their own)"
    return "missing (Debian: systemd)"
