"""``rqsys install-units``: put the systemd units, sysusers and tmpfiles in place.

The files in ``units/`` name ``/usr/bin/rqsys`` (where a distribution package
puts it); installing renders them with the path of the ``rqsys`` that runs
this command, so a venv or ``pip install --user`` works the same.  Then, when
systemd is running (and no ``--prefix`` was given), it creates the ``rq``
user, the directories, and reloads systemd.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from rqsys.errors import ConfigError

PACKAGED_EXEC = "/usr/bin/rqsys"
UNIT_FILES = ("rq@.socket", "rq@.service", "rq-web.socket", "rq-web.service",
              "rq-scan.service", "rq.target", "rq-timer@.service", "rq-relay-worker.socket",
              "rq-relay-worker.service")
# (file in units/, where it goes under the prefix)
EXTRA_FILES = (("sysusers.d/rqsys.conf", "etc/sysusers.d/rqsys.conf"),
               ("tmpfiles.d/rqsys.conf", "etc/tmpfiles.d/rqsys.conf"))
UNIT_DIR = "etc/systemd/system"
SETUP_COMMANDS = (["systemd-sysusers", "/etc/sysusers.d/rqsys.conf"],
                  ["systemd-tmpfiles", "--create", "/etc/tmpfiles.d/rqsys.conf"],
                  ["systemctl", "daemon-reload"])


def source_dir() -> Path:
    """``units/`` of the source tree (an editable install) or of the package."""
    here = Path(__file__).resolve()
    # <prefix>/lib/pythonX.Y/site-packages/rqsys/install/units.py -> <prefix>/share/rqsys/units
    # is where setup.py installs them (pip install, a --prefix, a venv).
    shared = here.parents[5] / "share" / "rqsys" / "units" if len(here.parents) > 5 else here
    for candidate in (here.parents[2] / "units", here.parents[1] / "units", shared,
                      Path(sys.prefix) / "share" / "rqsys" / "units"):
        if (candidate / "rq@.service").is_file():
            return candidate
    raise ConfigError("the unit files (units/rq@.service) are not installed with rqsys")


def rqsys_executable() -> str:
    """The absolute path of the ``rqsys`` command next to this Python."""
    beside = Path(sys.executable).parent / "rqsys"
    found = str(beside) if beside.is_file() else shutil.which("rqsys")
    if not found:
        raise ConfigError("cannot find the rqsys executable (use --exec PATH)")
    return os.path.abspath(found)


def render(text: str, executable: str) -> str:
    """A unit file's text with its ExecStart pointing at ``executable``."""
    return text.replace(PACKAGED_EXEC, executable)


def install(prefix: Path, executable: str) -> list[Path]:
    """Write every file under ``prefix``; returns the paths written."""
    if not os.path.isabs(executable) or not os.access(executable, os.X_OK):
        raise ConfigError(f"--exec {executable}: not an absolute path to an executable")
    src = source_dir()
    pairs = [(name, f"{UNIT_DIR}/{name}") for name in UNIT_FILES] + list(EXTRA_FILES)
    written = []
    for name, target in pairs:
        path = prefix / target
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render((src / name).read_text(), executable))
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from exc
        written.append(path)
    return written


def systemd_running() -> bool:
    """True when systemd is PID 1 here (sd_booted(3))."""
    from systemd import daemon

    return bool(daemon.booted())


def activate() -> None:
    """Create the user and directories and make systemd read the new units."""
    for argv in SETUP_COMMANDS:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            why = result.stderr.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
            raise ConfigError(f"{' '.join(argv)} failed: {why[0]}")


def main(prefix: Path | None, executable: str | None) -> int:
    """The ``install-units`` command; prints each file written."""
    for path in install(prefix or Path("/"), executable or rqsys_executable()):
        print(path)
    if prefix is None and systemd_running():
        activate()
        print("systemd reloaded; now: systemctl enable --now rq-web.socket rq@QUEUE.socket")
    return 0
