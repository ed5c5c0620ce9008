"""The suite's QEMU guests, booted all at once: the power cuts, the no-sync proof, the cuts
in a migration, the limits.

Under TCG (a host without working KVM) each guest keeps one core busy for
minutes, and alone it leaves the other idle; together they keep both busy,
and the suite waits for the slowest instead of the sum.  The first test that
asks for them (``conftest.guests``) waits until every guest is done, so no
guest runs beside the rest of the suite, whose timings it would disturb.
Each result is a value or the exception its run raised, for its own tests.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "system" / "powercut"))

import pc_kernel  # noqa: E402  (tests/system/powercut/)
import qemu_vm  # noqa: E402
import run as powercut  # noqa: E402
import vm_systemd  # noqa: E402

FILE_SYSTEMS = ("ext4", "xfs", "ext4-nojournal")
CUTS = 1  # per file system: a cut is a few minutes of one core under TCG
# without a journal, where synchronous directories (chattr +D) alone must not
# pass; make test-powercut proves it on ext4 with a journal too
NOSYNC_FILE_SYSTEMS = ("ext4-nojournal",)
MAX_DELAY = 3.0  # seconds from the clients' first acknowledgement to the cut (times SLOWDOWN)
# a migration of the root's format cut by the guest itself at each point, an image each
MIGRATE_FILE_SYSTEM = "ext4"
MIGRATE_CUTS = powercut.MIGRATE_CUTS
MODULES = {"built": "test_powercut.py", "nosync": "test_powercut.py",
           "migrate": "test_migrate_cut.py",
           "limits": "test_vm_limits.py"}  # the test module that reads each run


@dataclass
class Outcome:
    """What one guest run gave: its value, or why it has none."""

    value: Any = None
    error: BaseException | None = None
    missing: str = ""  # a part this host lacks: the run was not started

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def cut(workdir: Path, fs: tuple[str, ...], cuts: int, **extra: Any) -> list[powercut.Tally]:
    seed = int.from_bytes(os.urandom(4))
    extra.setdefault("jobs", len(fs))
    opts = powercut.Options(cycles=cuts, fs=list(fs), max_delay=MAX_DELAY, seed=seed,
                            workdir=workdir, quiet=True, **extra)
    return powercut.run(opts)


def limits(work: Path) -> dict[str, Any]:
    work.mkdir()
    try:
        return vm_systemd.boot(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_all(base: Path, wanted: set[str]) -> dict[str, Outcome]:
    """The ``wanted`` guest runs at once; their outcomes once the last has ended."""
    runs: dict[str, tuple[str, Callable[[], Any]]] = {
        "built": (pc_kernel.missing_parts(), lambda: cut(base / "built", FILE_SYSTEMS, CUTS)),
        "nosync": (pc_kernel.missing_parts(),
                   lambda: cut(base / "nosync", NOSYNC_FILE_SYSTEMS, 1, nosync=True,
                               roles=["burst"])),  # creates are what it must lose
        "migrate": (pc_kernel.missing_parts(),
                    lambda: cut(base / "migrate", (MIGRATE_FILE_SYSTEM,), 1,
                                migrate_cuts=list(MIGRATE_CUTS), jobs=len(MIGRATE_CUTS))),
        "limits": (vm_systemd.missing(), lambda: limits(base / "limits")),
    }
    runs = {name: run for name, run in runs.items() if name in wanted}
    outcomes = {name: Outcome(missing=missing) for name, (missing, _) in runs.items()}
    if any(not missing for missing, _ in runs.values()):
        qemu_vm.accel_mode()  # probed once, before the guests
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(work) for name, (missing, work) in runs.items()
                   if not missing}
    for name, future in futures.items():
        try:
            outcomes[name].value = future.result()
        except Exception as exc:  # noqa: BLE001 - it belongs to that run's tests
            outcomes[name].error = exc
    return outcomes
