"""Installing rqsys as an operator would: ``pip install .`` into a fresh venv
puts the man pages (built by scdoc) in share/man and the units in
share/rqsys/units, and the installed ``rqsys install-units`` works on a plain
systemd machine (a booted container): symlink a script, send a message, done.

The fresh venv has no pip and reads its dependencies (and the build tools)
from the development venv through a .pth file, so nothing is downloaded; the
package itself comes only from the wheel built here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, need, wait_for

SOURCES = ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in", "rqsys", "man", "units")
PAGES = {"man1": "rq.1", "man8": "rqsys.8", "man7": "rq-queue-script.7", "man5": "rqsys.json.5"}
DEV_SITE = sysconfig.get_paths()["purelib"]
PIP_TIMEOUT = 120


def copy_source(dest: Path) -> Path:
    """The files a source distribution holds, without build products."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "_rqspawn.c", "*.egg-info")
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    return dest


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=60)
    site = Path(subprocess.run([str(path / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_rqsys_dev_deps.pth").write_text(DEV_SITE + "\n")
    return path


def pip_install(venv: Path, source: Path, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-deps", "--no-build-isolation", "--no-index", "--disable-pip-version-check",
         str(source)],
        capture_output=True, text=True, timeout=PIP_TIMEOUT, env=env, cwd=source)


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """A fresh venv with rqsys pip-installed; under build/ (not /tmp) so that
    services with PrivateTmp= in the container test can run it."""
    need(shutil.which("scdoc") is not None, "scdoc (Debian scdoc)")
    base = REPO / "build" / f"test-install-{os.getpid()}"
    try:
        venv = fresh_venv(base / "venv")
        done = pip_install(venv, copy_source(_mkdir(base / "src")))
        assert done.returncode == 0, done.stdout + done.stderr
        yield venv
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_man_pages_are_installed_and_found_by_man(installed: Path) -> None:
    mandir = installed / "share" / "man"
    for section, page in PAGES.items():
        assert (mandir / section / page).is_file(), f"{section}/{page} not installed"
    need(shutil.which("man") is not None, "man (Debian man-db)")
    found = subprocess.run(["man", "-M", str(mandir), "-w", "rq", "rqsys", "rq-queue-script",
                            "rqsys.json"], capture_output=True, text=True, timeout=30)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [str(mandir / s / p) for s, p in PAGES.items()]


def test_installed_pages_pass_mandoc_lint(installed: Path) -> None:
    need(shutil.which("mandoc") is not None, "mandoc (Debian mandoc)")
    pages = [str(installed / "share" / "man" / s / p) for s, p in PAGES.items()]
    done = subprocess.run(["mandoc", "-Tlint", "-W", "error", *pages], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def test_units_are_installed(installed: Path) -> None:
    shipped = {p.relative_to(REPO / "units") for p in (REPO / "units").rglob("*") if p.is_file()}
    target = installed / "share" / "rqsys" / "units"
    assert shipped, "units/ is empty"
    assert {p.relative_to(target) for p in target.rglob("*") if p.is_file()} == shipped
    for path in shipped:
        assert (target / path).read_bytes() == (REPO / "units" / path).read_bytes()


def test_installed_commands_run_the_installed_package(installed: Path) -> None:
    where = subprocess.run([str(installed / "bin" / "python"), "-c",
                            "import rqsys, rqsys._native._rqspawn; from rqsys import config; "
                            "config.schema('queue'); print(rqsys.__file__)"],
                           capture_output=True, text=True, timeout=30, cwd=installed)
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(installed)), where.stdout
    for command in ("rq", "rqsys"):
        done = subprocess.run([str(installed / "bin" / command), "--help"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_install_units_renders_the_installed_paths(installed: Path, tmp_path: Path) -> None:
    rqsys = installed / "bin" / "rqsys"
    done = subprocess.run([str(rqsys), "install-units", "--prefix", str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    service = (tmp_path / "etc/systemd/system/rq@.service").read_text()
    assert f"ExecStart={rqsys} queue %i" in service
    assert (tmp_path / "etc/tmpfiles.d/rqsys.conf").is_file()


def test_source_distribution_carries_man_sources_and_units(tmp_path: Path) -> None:
    src = copy_source(_mkdir(tmp_path / "src"))
    done = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)],
                          cwd=src, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    assert done.returncode == 0, done.stderr
    (sdist,) = tmp_path.glob("rqsys-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = {f"man/{p.name}" for p in (REPO / "man").glob("*.scd")}
    wanted |= {str(p.relative_to(REPO)) for p in (REPO / "units").rglob("*") if p.is_file()}
    assert wanted <= names, sorted(wanted - names)


def _path_without(tool: str, tmp_path: Path) -> str:
    """A PATH whose directories hold every command of this one except ``tool``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in reversed(os.environ["PATH"].split(os.pathsep)):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if name != tool:
                link = bin_dir / name
                link.unlink(missing_ok=True)
                link.symlink_to(os.path.join(directory, name))
    return str(bin_dir)


def test_without_scdoc_the_install_warns_and_leaves_out_man(tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "venv")
    (tmp_path / "src").mkdir()
    env = dict(os.environ, PATH=_path_without("scdoc", tmp_path))
    done = pip_install(venv, copy_source(tmp_path / "src"), env)
    assert done.returncode == 0, done.stderr
    assert not (venv / "share" / "man").exists()
    assert (venv / "share" / "rqsys" / "units" / "rq@.service").is_file()


def test_without_scdoc_a_required_man_build_fails_clearly(tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "venv")
    (tmp_path / "src").mkdir()
    env = dict(os.environ, PATH=_path_without("scdoc", tmp_path), RQSYS_REQUIRE_MAN="1")
    done = pip_install(venv, copy_source(tmp_path / "src"), env)
    assert done.returncode != 0
    assert "scdoc(1) is needed to build the man pages" in done.stdout + done.stderr
    assert not (venv / "bin" / "rqsys").exists()


# ---------------------------------------------------------------- helpers (test_install_system
# runs the special queues from the installed wheel)
def _installed_package(venv: Path) -> Path:
    found = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import rqsys, os; print(os.path.dirname(rqsys.__file__))"],
                           capture_output=True, text=True, timeout=30, cwd=venv)
    return Path(found.stdout.strip())


def _status(rq: list[str], url: str) -> str:
    return subprocess.run([*rq, "statusmesg", "--msg_id", url], capture_output=True,
                          text=True, timeout=30).stdout.strip()


def _relayed(rq: list[str], url: str) -> str:
    status = _status(rq, url)
    assert not status.startswith("ok err"), status
    return status if status.startswith("ok relayed - ") else ""


# ---------------------------------------------------------------- a plain systemd box
HELLO = """\
#!/bin/sh
echo "hello $RQ_PARAM1"
echo "done greeted $RQ_PARAM1" >&3
"""


@pytest.fixture(scope="module")
def box() -> Iterator[object]:
    from nspawn import Container, can_boot

    reason = can_boot()
    need(not reason, reason)
    container = Container()
    try:
        container.boot()
        yield container
    finally:
        container.shutdown()


def test_install_units_on_a_booted_systemd(box, installed: Path) -> None:  # type: ignore[no-untyped-def]
    # Given rqsys pip-installed into a venv, on a freshly booted systemd
    box.expose_python(installed, sys.base_prefix)
    rqsys, rq = str(installed / "bin" / "rqsys"), str(installed / "bin" / "rq")
    # When the operator installs the units and symlinks a script into the scandir
    box.run(rqsys, "install-units")
    box.run("systemctl", "enable", "--now", "rq-scan.service", "rq-web.socket")
    script_dir = _mkdir(box.path("/srv/hello"))
    (script_dir / "run").write_text(HELLO)
    (script_dir / "run").chmod(0o755)
    box.run("ln", "-s", "/srv/hello", "/var/lib/rq/scandir/hello")
    try:
        wait_for(lambda: box.run("test", "-S", "/run/rq/hello.sock", check=False).returncode == 0,
                 30, "rq@hello.socket")
    except pytest.fail.Exception:
        pytest.fail("rq-scan did not make queue hello live:\n" + _journal(box, "rq-scan"))
    # Then a message sent with the installed rq runs to done, as user rq
    out = box.run(rq, "sendmesg", "--dest", "hello", "--param1", "box", check=False).stdout
    assert out.startswith("ok http://"), out + _journal(box, "rq@hello")
    url = out.split()[1]
    wait_for(lambda: box.run(rq, "statusmesg", "--msg_id", url, check=False).stdout.strip()
             == "ok done - greeted box", 30, "the message to reach done")
    assert box.show("rq@hello.service", "User") == "rq"
    assert f"path={rqsys} " in box.show("rq@hello.service", "ExecStart")
    # And its man pages are where man looks in that venv
    assert box.run("man", "-M", str(installed / "share" / "man"), "-w", "rq").stdout.strip()


def test_a_queue_made_by_rq_scan_belongs_to_rq(box, installed: Path) -> None:  # type: ignore[no-untyped-def]
    # Given the units installed and rq-scan running (as in the test above)
    box.expose_python(installed, sys.base_prefix)
    box.run(str(installed / "bin" / "rqsys"), "install-units")
    box.run("systemctl", "enable", "--now", "rq-scan.service")
    script_dir = _mkdir(box.path("/srv/owned"))
    (script_dir / "run").write_text(HELLO)
    (script_dir / "run").chmod(0o755)
    # When a script is symlinked into the scandir
    box.run("ln", "-s", "/srv/owned", "/var/lib/rq/scandir/owned")
    wait_for(lambda: box.path("/var/lib/rq/queue/owned/config.json").exists(), 30,
             "queue owned created")
    # Then its directories belong to the user its daemon runs as
    owners = box.run("find", "/var/lib/rq/queue/owned", "-not", "-user", "rq").stdout.split()
    assert owners == []


def _journal(box, unit: str) -> str:  # type: ignore[no-untyped-def]
    return str(box.run("journalctl", "--no-pager", "-n", "40", "-u", unit, check=False).stdout)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- the README's quick start
def quick_start_lines() -> list[str]:
    section = (REPO / "README.md").read_text().split("## Your first queue in one minute", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_readme_first_queue_runs_as_written(tmp_path: Path) -> None:
    # Given the README's commands, run by bash in a fresh HOME (another port)
    lines = quick_start_lines()
    serve = next(i for i, line in enumerate(lines) if line.startswith("rqsys "))
    port = str(free_port())
    env = dict(os.environ, HOME=str(tmp_path),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    bash = ["bash", "-euc"]
    setup = subprocess.run([*bash, "\n".join(lines[:serve])], env=env, capture_output=True,
                           text=True, timeout=30)
    assert setup.returncode == 0, setup.stderr
    command = lines[serve].removesuffix("&").strip().replace("3333", port)
    proc = subprocess.Popen([*bash, f"exec {command}"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (tmp_path / "rq" / "sock" / "hello.sock").exists(), 30, "serve ready")
        # When the message is sent as the README says
        send = next(line for line in lines if " sendmesg " in line)
        out = subprocess.run([*bash, send], env=env, capture_output=True, text=True,
                             timeout=30).stdout
        assert out.startswith("ok http://") and f":{port}/q/hello/" in out, out
        # Then statusmesg says what the README shows
        status = next(line for line in lines if line.startswith("# ok done"))[2:]
        check = next(line for line in lines if " statusmesg " in line)
        check = re.sub(r"--msg_id \S+", f"--msg_id {out.split()[1]}", check)
        wait_for(lambda: subprocess.run([*bash, check], env=env, capture_output=True,
                                        text=True, timeout=30).stdout.strip() == status,
                 30, status)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail("rqsys serve ignored SIGTERM")
