"""Power cuts of a real kernel running rqsys: nothing acknowledged is lost or corrupted.

Debian's kernel under QEMU runs rqsys (``rqsys serve``) on a disk image
while clients create messages, attach files and relay, and the host kills
QEMU at a random moment; the next boot checks the file system, lets rqsys
recover and compares the disk with every acknowledgement (see README.md).
The full counts are ``make test-powercut`` (``run.py``); this runs one cut
per file system (a cut costs minutes under TCG, on hosts without KVM).
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pc_kernel  # noqa: E402
import qemu_vm  # noqa: E402  (tests/, put on the path by pc_kernel)
import run  # noqa: E402

FILE_SYSTEMS = ("ext4", "xfs", "ext4-nojournal")
CUTS = 1  # per file system, all at once: 5-7 minutes under TCG on 2 cores
# without a journal, where synchronous directories (chattr +D) alone must not
# pass; make test-powercut proves it on ext4 with a journal too
NOSYNC_FILE_SYSTEMS = ("ext4-nojournal",)
MAX_DELAY = 3.0  # seconds from the clients' first acknowledgement to the cut
IN_CI = os.environ.get("CI") == "true"


def need_kernel() -> None:
    """Skip without root and QEMU on a developer's machine; fail in CI."""
    missing = pc_kernel.missing_parts()
    if not missing:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {missing}")
    pytest.skip(missing)


@pytest.fixture(scope="module")
def accel() -> str:
    """KVM or TCG, probed once (tests/qemu_vm.py), said in the output."""
    need_kernel()
    mode = qemu_vm.accel_mode()
    print(f"powercut: QEMU with {qemu_vm.accel_report()}")
    return mode


def cut(tmp_path: Path, fs: list[str], cuts: int, **extra: object) -> list[run.Tally]:
    opts = run.Options(cycles=cuts, fs=fs, max_delay=MAX_DELAY, seed=int.from_bytes(os.urandom(4)),
                       workdir=tmp_path / "powercut", quiet=True, jobs=len(fs),
                       **extra)  # type: ignore[arg-type]
    return run.run(opts)


def summary(tallies: list[run.Tally]) -> str:
    out = io.StringIO()
    run.report(tallies, out)
    return out.getvalue()


def test_power_cuts_lose_no_acknowledged_message(tmp_path: Path, accel: str) -> None:
    # Given rqsys on each file system with clients creating, attaching and relaying
    # When the power is cut at random moments and the kernel boots again
    tallies = cut(tmp_path, list(FILE_SYSTEMS), CUTS)
    # Then every acknowledged message is in exactly one state, intact
    text = summary(tallies)
    print(text)
    assert all(t.clean() for t in tallies), text
    assert all(t.cuts == CUTS and t.acked > 0 for t in tallies), text


def test_harness_catches_a_build_that_does_not_sync(tmp_path: Path, accel: str) -> None:
    # Given rqsys whose fsync, fdatasync and syncfs do nothing (LD_PRELOAD)
    # When the power is cut while clients create messages
    tallies = cut(tmp_path, list(NOSYNC_FILE_SYSTEMS), 1, nosync=True)
    # Then the check finds acknowledged messages lost or corrupted on each
    text = summary(tallies)
    print(text)
    assert all(t.acked > 0 for t in tallies), text
    assert all(t.lost or t.corrupted for t in tallies), text
