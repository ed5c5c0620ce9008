"""The unit files: ``rqsys install-units``, ``systemd-analyze verify`` and ``security``.

Runs the real ``rqsys`` command and the real systemd-analyze on the rendered
files (no systemd needed as PID 1).  The booted-systemd behaviour is in
test_systemd.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, need

RQSYS = str(Path(sys.executable).parent / "rqsys")
UNITS = REPO / "units"
UNIT_FILES = ("rq@.socket", "rq@.service", "rq-web.socket", "rq-web.service",
              "rq-scan.service", "rq.target", "rq-timer@.service", "rq-relay-worker.socket",
              "rq-relay-worker.service")
# unit (as verified) -> highest exposure allowed by the issue
EXPOSURE_LIMITS = {"rq@example.service": 5.0, "rq-web.service": 4.0, "rq-scan.service": 5.0,
                   "rq-timer@example.service": 3.0, "rq-relay-worker.service": 1.1}


def install_units(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RQSYS, "install-units", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def unit_dir(tmp_path: Path) -> Path:
    """The units rendered by ``rqsys install-units --prefix``, templates as instances."""
    result = install_units("--prefix", str(tmp_path), "--exec", RQSYS)
    assert result.returncode == 0, result.stderr
    units = tmp_path / "etc" / "systemd" / "system"
    for template in ("rq@.socket", "rq@.service", "rq-timer@.service"):
        shutil.copy(units / template, units / template.replace("@", "@example"))
    return units


def analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    need(shutil.which("systemd-analyze") is not None, "systemd-analyze is not installed")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_install_units_writes_every_file_with_this_rqsys(tmp_path: Path) -> None:
    # When the units are installed under a prefix
    result = install_units("--prefix", str(tmp_path))
    # Then every file is there and ExecStart names the rqsys that installed them
    assert result.returncode == 0, result.stderr
    units = tmp_path / "etc" / "systemd" / "system"
    assert sorted(p.name for p in units.iterdir()) == sorted(UNIT_FILES)
    for name in ("rq@.service", "rq-web.service", "rq-scan.service", "rq-timer@.service",
                 "rq-relay-worker.service"):
        text = (units / name).read_text()
        assert re.search(rf"^ExecStart={re.escape(RQSYS)} ", text, re.M), name
        assert "/usr/bin/rqsys" not in text
    assert "u rq " in (tmp_path / "etc/sysusers.d/rqsys.conf").read_text()
    assert "d /run/rq " in (tmp_path / "etc/tmpfiles.d/rqsys.conf").read_text()
    assert result.stdout.splitlines()[0] == str(units / "rq@.socket")


def test_socket_directory_survives_a_stop() -> None:
    # No unit may own /run/rq as a RuntimeDirectory (systemd deletes those on stop)
    for name in UNIT_FILES:
        assert not re.search(r"^RuntimeDirectory=", (UNITS / name).read_text(), re.M), name
    assert re.search(r"^ListenStream=/run/rq/%i\.sock$", (UNITS / "rq@.socket").read_text(),
                     re.M)


def test_verify_prints_nothing(unit_dir: Path) -> None:
    # Given the rendered units; when systemd-analyze verifies them (templates by instance)
    names = ["rq@example.socket", "rq@example.service", "rq-web.socket", "rq-web.service",
             "rq-scan.service", "rq.target", "rq-timer@example.service",
             "rq-relay-worker.socket", "rq-relay-worker.service"]
    # (--man=no: the man pages are built by setup.py, not present in a bare checkout)
    result = analyze("verify", "--man=no", *[f"./{n}" for n in names], cwd=unit_dir)
    # Then it has nothing to say
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize("unit", sorted(EXPOSURE_LIMITS))
def test_security_exposure_within_limit(unit_dir: Path, unit: str) -> None:
    result = analyze("security", "--offline=true", "--no-pager", f"./{unit}", cwd=unit_dir)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= EXPOSURE_LIMITS[unit], result.stdout


def test_install_units_rejects_a_relative_exec(tmp_path: Path) -> None:
    result = install_units("--prefix", str(tmp_path), "--exec", "bin/rqsys")
    assert result.returncode == 1
    assert result.stderr.startswith("rqsys: --exec bin/rqsys: not an absolute path")
    assert not any(tmp_path.iterdir()), "nothing may be written"


def test_install_units_unwritable_prefix_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = install_units("--prefix", str(blocker), "--exec", RQSYS)
    assert result.returncode == 1
    assert result.stderr.startswith(f"rqsys: cannot write {blocker}/etc/systemd/system/")
    assert "Traceback" not in result.stderr
    assert blocker.read_text() == "not a directory"
