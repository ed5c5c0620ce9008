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
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qemu_vm  # noqa: E402  (tests/, on the path through its conftest)
import run  # noqa: E402
from conftest import need  # noqa: E402
from guest_runs import CUTS, FILE_SYSTEMS  # noqa: E402


def tallies(outcome: Any) -> list[run.Tally]:
    """A run's tallies; skipped without its parts on a developer's machine, failed in CI."""
    need(not outcome.missing, outcome.missing)
    print(f"powercut: QEMU with {qemu_vm.accel_report()}")
    return list(outcome.get())


def summary(found: list[run.Tally]) -> str:
    out = io.StringIO()
    run.report(found, out)
    return out.getvalue()


def test_power_cuts_lose_no_acknowledged_message(guests: dict[str, Any]) -> None:
    # Given rqsys on each file system with clients creating, attaching and relaying
    # When the power is cut at random moments and the kernel boots again
    found = tallies(guests["built"])
    # Then every acknowledged message is in exactly one state, intact
    text = summary(found)
    print(text)
    assert all(t.clean() for t in found), text
    assert len(found) == len(FILE_SYSTEMS), text
    assert all(t.cuts == CUTS and t.acked > 0 for t in found), text


def test_harness_catches_a_build_that_does_not_sync(guests: dict[str, Any]) -> None:
    # Given rqsys whose fsync, fdatasync and syncfs do nothing (LD_PRELOAD)
    # When the power is cut while clients create messages
    found = tallies(guests["nosync"])
    # Then the check finds acknowledged messages lost or corrupted on each
    text = summary(found)
    print(text)
    assert all(t.acked > 0 for t in found), text
    assert all(t.lost or t.corrupted for t in found), text
