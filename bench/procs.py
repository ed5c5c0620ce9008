"""Stopping the processes a benchmark started: TERM, then KILL of their group."""

from __future__ import annotations

import os
import signal
import subprocess

GRACE = 60.0  # seconds a process gets to stop after SIGTERM


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, wait; if it is still there after GRACE, SIGKILL its process group."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
