"""Power cuts of a real kernel running rqsys: nothing acknowledged is lost or corrupted.

A User-Mode Linux kernel runs rqsys (``rqsys serve``) on a disk image while
clients create messages, attach files and relay, and the host kills the
kernel at a random moment; the next boot checks the file system, lets rqsys
recover and compares the disk with every acknowledgement (see README.md).
The full counts are ``make test-powercut`` (``run.py``); this runs a few
cuts per file system.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pc_kernel  # noqa: E402
import run  # noqa: E402

FILE_SYSTEMS = ("ext4", "xfs", "ext4-nojournal")
CUTS = 2  # per file system; the file systems at once keep this near two minutes
# with and without a journal: synchronous directories (chattr +D) alone must not pass
NOSYNC_FILE_SYSTEMS = ("ext4", "ext4-nojournal")
MAX_DELAY = 3.0  # seconds from the clients' first acknowledgement to the cut
IN_CI = os.environ.get("CI") == "true"


def need_kernel() -> None:
    """Skip without root and UML on a developer's machine; fail in CI."""
    missing = pc_kernel.missing_parts()
    if not missing:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {missing}")
    pytest.skip(missing)


@pytest.fixture(scope="module")
def fpu(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Whether UML needs the FPU workaround on this CPU, probed once."""
    need_kernel()
    opts = run.Options(cycles=0, fs=[], pythonpath="")
    return "on" if run.decide_fpu(opts, tmp_path_factory.mktemp("probe")) else "off"


def cut(tmp_path: Path, fpu: str, fs: list[str], cuts: int, **extra: object) -> list[run.Tally]:
    opts = run.Options(cycles=cuts, fs=fs, max_delay=MAX_DELAY, seed=int.from_bytes(os.urandom(4)),
                       workdir=tmp_path / "powercut", fpu=fpu, quiet=True, jobs=len(fs),
                       **extra)  # type: ignore[arg-type]
    return run.run(opts)


def summary(tallies: list[run.Tally]) -> str:
    out = io.StringIO()
    run.report(tallies, out)
    return out.getvalue()


def test_power_cuts_lose_no_acknowledged_message(tmp_path: Path, fpu: str) -> None:
    # Given rqsys on each file system with clients creating, attaching and relaying
    # When the power is cut at random moments and the kernel boots again
    tallies = cut(tmp_path, fpu, list(FILE_SYSTEMS), CUTS)
    # Then every acknowledged message is in exactly one state, intact
    text = summary(tallies)
    print(text)
    assert all(t.clean() for t in tallies), text
    assert all(t.cuts == CUTS and t.acked > 0 for t in tallies), text


def test_harness_catches_a_build_that_does_not_sync(tmp_path: Path, fpu: str) -> None:
    # Given rqsys whose fsync, fdatasync and syncfs do nothing (LD_PRELOAD)
    # When the power is cut while clients create messages
    tallies = cut(tmp_path, fpu, list(NOSYNC_FILE_SYSTEMS), 1, nosync=True)
    # Then the check finds acknowledged messages lost or corrupted on each
    text = summary(tallies)
    print(text)
    assert all(t.acked > 0 for t in tallies), text
    assert all(t.lost or t.corrupted for t in tallies), text
