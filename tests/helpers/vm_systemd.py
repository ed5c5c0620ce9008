"""A real systemd booted as the init of a QEMU guest, where the kernel enforces cgroup v2 limits.

This host's containers see cgroup v1 controllers, read-only (tests/helpers/nspawn.py):
no memory.max, cpu.max or pids.max is ever enforced there.  The guest
(tests/helpers/qemu_vm.py: Debian's kernel, KVM or TCG) is a kernel of its own, so
its systemd mounts the unified cgroup v2 hierarchy with every controller.
The guest's root is the host's ``/`` over 9p, read-only (as in
tests/system/powercut/); this module is also the guest's first init: it mounts
tmpfs on /run, /tmp and /var, a tmpfs copy of /etc with the rq units
installed, and execs /lib/systemd/systemd, which boots ``rq-vm.target``:
rq-scan and ``rq-vm-drive.service``, which runs :func:`drive` (as root) and
powers off.  The work directory (a host temp dir, shared read-write and
mounted in the guest at :data:`GUEST_DIR`) holds the venv the rq units run
(made from /usr/bin/python3: user rq cannot enter /root, where this venv's
Python may be; it reaches the checkout's venv through a .pth), the queues'
scripts, and ``results.json``, the facts the host's tests assert.

Usage from the host: ``boot(workdir)`` returns the results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import qemu_vm

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
GUEST_MEM = "1536M"  # a 600 MB allowance beside systemd and a dozen Pythons
BOOT_TIMEOUT = 900.0  # boot, the scenario, power-off: under TCG on a busy host
GUEST_DIR = "/run/rq-vm"  # the work directory inside (not under /tmp: PrivateTmp= hides it)
WAIT_S = 300.0  # the guest's waits for one step (TCG runs Python 20-35 times slower)

ALLOC = ("import os, sys; d = bytearray(int(sys.argv[1]) << 20); "
         "d[::4096] = b'x' * len(d[::4096]); open(3, 'w').write('done allocated\\n')")
FORKS = ("import os, time\nok = refused = 0\nfor _ in range(20):\n"
         "    try:\n        pid = os.fork()\n    except OSError:\n        refused += 1\n"
         "        continue\n    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n"
         "    ok += 1\nopen(3, \"w\").write(f\"done forks {ok} refused {refused}\\n\")\n")
SPIN = ("import time\nend = time.monotonic() + 2\nwhile time.monotonic() < end:\n    pass\n"
        "open(3, \"w\").write(\"done spun\\n\")\n")
SCRIPT = f"""#!/bin/sh
case "$RQ_PARAM1" in
alloc) exec python3 -c "{ALLOC}" "$RQ_PARAM2" ;;
forks) exec python3 -c '{FORKS}' ;;
spin) exec python3 -c '{SPIN}' ;;
esac
"""
IDLE = {"idle_timeout": 3600}  # started before the first send, they stay for the scenario
QUEUES = {
    "lim": {"num_workers": 2, "message_limits": {"memory_max": "40M", "tasks_max": 8}, **IDLE},
    "peak": {"message_limits": {"memory_max": "600M"}, **IDLE},
    "whole": {"limits": {"memory_max": "128M"}, **IDLE},
    "need": {"num_workers": 2, "budget": {"memory": "96M"}, **IDLE},  # needs: no message_limits
}


# ---------------------------------------------------------------- the host
def missing() -> str:
    """Why a guest with systemd cannot be booted here ('' when it can)."""
    for path in ("/lib/systemd/systemd", "/usr/bin/python3"):
        if not os.access(path, os.X_OK):
            return f"{path} missing (Debian: systemd, python3)"
    return qemu_vm.missing()


def make_venv(work: Path) -> Path:
    """A venv of /usr/bin/python3 that imports this checkout's venv's packages."""
    venv = work / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" \
        / "site-packages"
    [inner] = list((venv / "lib").glob("python3*/site-packages"))
    (inner / "rq-checkout.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    for name, func in (("rq", "rqsys.cli.rq:rq_main"), ("rqsys", "rqsys.cli.admin:rqsys_main")):
        module, call = func.split(":")
        (venv / "bin" / name).write_text(f"#!{GUEST_DIR}/venv/bin/python\nimport sys\n"
                                         f"from {module} import {call}\nsys.exit({call}())\n")
        (venv / "bin" / name).chmod(0o755)
    return venv


def guest(work: Path) -> qemu_vm.Guest:
    """The guest: init is this module, its work directory shared read-write,
    and the checkout too where the guest's tmpfs on /tmp would hide it."""
    shares = [qemu_vm.Share("work", work)]
    if PROJECT.is_relative_to("/tmp"):
        shares.append(qemu_vm.Share("project", PROJECT, readonly=True))
    return qemu_vm.Guest(init=[sys.executable, str(Path(__file__))], console=work / "console.txt",
                         env={"RQVM": str(work)}, shares=shares, memory=GUEST_MEM,
                         cmdline=["systemd.unified_cgroup_hierarchy=1", "systemd.show_status=0",
                                  "systemd.unit=rq-vm.target"])


def boot(work: Path) -> dict[str, Any]:
    """Boot the guest, let it run :func:`drive` and power off; its results."""
    work.chmod(0o755)  # user rq reads the venv and the scripts there
    make_venv(work)
    vm = guest(work)
    vm.start()
    try:
        vm.wait(BOOT_TIMEOUT)
    except qemu_vm.VMError:
        pass  # the results say how far it got
    results = work / "results.json"
    if not results.exists():
        raise AssertionError("the guest left no results; console:\n" + vm.console_tail(40))
    return dict(json.loads(results.read_text()))


# ---------------------------------------------------------------- the guest's init
def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def init(work: str) -> None:
    """PID 1 before systemd: writable /run, /tmp, /var, /etc; the units; exec systemd."""
    sh("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run")
    for path in ("/tmp", "/var"):
        sh("mount", "-t", "tmpfs", "-o", "mode=1777" if path == "/tmp" else "mode=755",
           "tmpfs", path)
    if PROJECT.is_relative_to("/tmp"):  # a CI clone: the tmpfs just hid it
        os.makedirs(PROJECT)
        sh("mount", "-t", "9p", "-o", qemu_vm.mount_options("loose"), "project", str(PROJECT))
    os.makedirs(GUEST_DIR)
    sh("mount", "-t", "9p", "-o", qemu_vm.mount_options(), "work", GUEST_DIR)
    work = GUEST_DIR
    shutil.copytree("/etc", "/run/etc", symlinks=True)
    sh("mount", "--bind", "/run/etc", "/etc")
    for sub in ("lib", "log", "tmp", "cache", "spool"):
        os.makedirs(f"/var/{sub}", exist_ok=True)
    os.chmod("/var/tmp", 0o1777)
    Path("/etc/machine-id").write_text("")  # systemd makes one (transient)
    Path("/etc/fstab").write_text("")  # the host's mounts are not the guest's
    sh(f"{work}/venv/bin/rqsys", "install-units")
    units = Path("/etc/systemd/system")
    if PROJECT.is_relative_to("/tmp"):  # and the services' PrivateTmp= would hide it
        for unit in ("rq@.service", "rq-scan.service", "rq-web.service"):
            (units / f"{unit}.d").mkdir(parents=True, exist_ok=True)
            (units / f"{unit}.d" / "checkout.conf").write_text(
                f"[Service]\nBindReadOnlyPaths={PROJECT}\n")
    # Under TCG beside the power-cut guests Python runs 20-35 times slower: a
    # daemon's start can outlast systemd's 90 s, and a turn its 30 s watchdog
    (units / "rq@.service.d").mkdir(parents=True, exist_ok=True)
    (units / "rq@.service.d" / "tcg.conf").write_text(
        "[Service]\nTimeoutStartSec=600\nWatchdogSec=300\n")
    (units / "rq-vm.target").write_text(
        "[Unit]\nDescription=rqsys limits in a QEMU guest\nRequires=basic.target\n"
        "Wants=rq-scan.service rq-vm-drive.service\nAfter=basic.target\n")
    (units / "rq-vm-drive.service").write_text(
        "[Unit]\nAfter=rq-scan.service basic.target\n[Service]\nType=oneshot\n"
        f"Environment=RQVM={work}\n"
        f"ExecStart={work}/venv/bin/python {Path(__file__)} drive\n"
        "ExecStopPost=/bin/systemctl --no-block poweroff\n")
    # systemd takes this for a container (the host's /.dockerenv), and then
    # reads its kernel command line words from its own argv
    os.execv("/lib/systemd/systemd", ["/lib/systemd/systemd", "--unit=rq-vm.target",
                                      "systemd.unified_cgroup_hierarchy=1"])


# ---------------------------------------------------------------- the scenario
def drive(work: Path) -> None:
    """Run the scenario inside the booted guest; write results.json, whatever happens."""
    facts: dict[str, Any] = {"uptime": [Path("/proc/uptime").read_text().split()[0]]}
    try:
        facts["controllers"] = Path("/sys/fs/cgroup/cgroup.controllers").read_text().split()
        for name, cfg in QUEUES.items():  # all at once: rq-scan takes seconds for each
            make_queue(work, name, cfg)
        wait(lambda: all(show(f"rq@{name}.socket", "ActiveState") == "active"
                         for name in QUEUES), "the queues' sockets")
        # each daemon started and ready before the first send (and kept: IDLE):
        # under TCG, beside other guests, a start can outlast the client's 30 s
        services = [f"rq@{name}.service" for name in QUEUES]
        subprocess.run(["systemctl", "start", "--no-block", *services], check=True)
        wait(lambda: all(show(unit, "ActiveState") == "active" for unit in services),
             "the queue daemons ready")
        scenario(facts)
    except Exception as exc:  # the host reports it, with what was found so far
        facts["error"] = f"{type(exc).__name__}: {exc} {getattr(exc, 'stderr', '') or ''}"
        facts["error"] += " ".join(f"{name}: {show(f'rq@{name}.service', 'Result')} "
                                   f"({show(f'rq@{name}.service', 'NRestarts')} restarts)"
                                   for name in QUEUES)
        facts["journal"] = subprocess.run(["journalctl", "-b", "--no-pager", "-n", "150"],
                                          capture_output=True, text=True).stdout
    finally:
        facts["uptime"].append(Path("/proc/uptime").read_text().split()[0])
        (work / "results.json").write_text(json.dumps(facts, indent=1))


def scenario(facts: dict[str, Any]) -> None:
    oom, small, forks = send("lim", ["alloc", "80"], ["alloc", "20"], ["forks"])
    peak, spin = send("peak", ["alloc", "200"], ["spin", {"cpu_quota": "20%"}])
    needs = {"needs": {"memory": "40M"}}  # a message's memory need is its run's memory_max
    need_oom, need_ok = send("need", ["alloc", "80", needs], ["alloc", "20", needs])
    for name, queue, msg_id in (("oom", "lim", oom), ("small", "lim", small),
                                ("forks", "lim", forks), ("peak", "peak", peak),
                                ("spin", "peak", spin), ("need_oom", "need", need_oom),
                                ("need_ok", "need", need_ok)):
        facts[name] = ended(queue, msg_id)
    pid = show("rq@lim.service", "MainPID")
    after = send("lim", ["alloc", "20"])  # beside the whole queue's, to save time
    whole(facts)
    facts["lim_after"] = ended("lim", *after)
    facts["lim_pids"] = [pid, show("rq@lim.service", "MainPID")]
    facts["lim_log"] = journal("rq@lim.service")


def whole(facts: dict[str, Any]) -> None:
    """The queue-level memory_max: in systemd, and enforced (its removal:
    tests/system/test_scan_systemd.py)."""
    facts["whole_memory_max"] = show("rq@whole.service", "MemoryMax")
    facts["whole"] = ended("whole", *send("whole", ["alloc", "200"]))
    pid = show("rq@whole.service", "MainPID")
    cgroup = Path("/sys/fs/cgroup" + show("rq@whole.service", "ControlGroup"))
    facts["whole_events"] = (cgroup / "memory.events").read_text()
    facts["whole_after"] = ended("whole", *send("whole", ["alloc", "20"]))
    facts["whole_pids"] = [pid, show("rq@whole.service", "MainPID")]


def make_queue(work: Path, name: str, cfg: dict[str, Any]) -> None:
    entry = work / "entries" / name
    entry.mkdir(parents=True)
    (entry / "run").write_text(SCRIPT)
    (entry / "run").chmod(0o755)
    (entry / "config.json").write_text(json.dumps(cfg))
    os.symlink(entry, f"/var/lib/rq/scandir/{name}")


def send(queue: str, *messages: list[Any]) -> list[str]:
    """Send messages (each its params, then maybe its own limits) in one ``rq
    sendmesg --bulk`` (a Python start costs seconds under TCG); their ids."""
    lines = "".join(json.dumps(_message(params)) + "\n" for params in messages)
    out = subprocess.run([str(Path(sys.executable).parent / "rq"), "sendmesg", "--dest", queue,
                          "--bulk", "-"], input=lines, capture_output=True, text=True,
                         check=True).stdout.split()
    return [word.rsplit("/", 1)[1] for word in out if word.startswith("http")]


def _message(params: list[Any]) -> dict[str, Any]:
    words = [p for p in params if isinstance(p, str)]
    msg: dict[str, Any] = {f"param{n}": p for n, p in enumerate(words, 1)}
    for fields in (p for p in params if isinstance(p, dict)):  # its needs, or its own limits
        msg.update(fields if "needs" in fields else {"limits": fields})
    return msg


def ended(queue: str, msg_id: str) -> dict[str, Any]:
    """The state, status and timeline of a message once it has ended."""
    from rqsys.observe import timeline
    from rqsys.store import QueueStore

    store = QueueStore(Path(f"/var/lib/rq/queue/{queue}"))
    state = wait(lambda: store.find(msg_id) in ("done", "err") and store.find(msg_id),
                 f"{queue}/{msg_id} ended")
    # The move is seen at once; the turn's timeline lines are written at its end
    lines = wait(lambda: _with_end(timeline.read(store.msg_dir(state, msg_id)), state),
                 f"{queue}/{msg_id}'s timeline to say {state}")
    return {"state": state, "status": store.read_status(state, msg_id), "timeline": lines}


def _with_end(lines: list[dict[str, Any]], state: str) -> list[dict[str, Any]] | None:
    return lines if any(line.get("ev") == state for line in lines) else None


def show(unit: str, prop: str) -> str:
    return subprocess.run(["systemctl", "show", "-p", prop, "--value", unit],
                          capture_output=True, text=True).stdout.strip()


def journal(unit: str) -> str:
    return subprocess.run(["journalctl", "-u", unit, "--no-pager"], capture_output=True,
                          text=True).stdout


def wait(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)  # a poll of the guest's files, in the scenario's own process
    return value


if __name__ == "__main__":
    if sys.argv[1:] == ["drive"]:
        drive(Path(os.environ["RQVM"]))
    else:
        init(os.environ["RQVM"])
