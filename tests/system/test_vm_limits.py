"""Per-run and queue limits where the kernel enforces them: systemd booted in
a QEMU guest with cgroup v2 and its memory, cpu and pids controllers
(tests/helpers/vm_systemd.py; this host's containers see only read-only cgroup v1
controllers).  One boot runs the whole scenario as user rq, as shipped (no
polkit rule), and these tests read what it found."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import need

MB = 1 << 20


@pytest.fixture(scope="module")
def facts(guests: dict[str, Any]) -> dict[str, Any]:
    """What the guest found (booted beside the power cuts: tests/helpers/guest_runs.py)."""
    outcome = guests["limits"]
    need(not outcome.missing, outcome.missing)
    found: dict[str, Any] = outcome.get()
    assert "error" not in found, (found["error"], found.get("journal", "")[-4000:])
    return found


def usage(ended: dict[str, Any]) -> dict[str, Any]:
    [event] = [e for e in ended["timeline"] if e["ev"] == "usage"]
    return event


def test_the_guests_systemd_has_cgroup_v2_with_controllers(facts):
    assert {"memory", "cpu", "pids"} <= set(facts["controllers"])
    assert "runs with limits get sub-cgroups of /sys/fs/cgroup/system.slice/system-rq.slice/" \
        "rq@lim.service (delegated; controllers: cpu memory pids)" in facts["lim_log"], \
        facts["lim_log"]  # whole: the way the daemon chose is among its first lines


def test_a_run_past_memory_max_ends_killed_by_the_oom_killer_and_the_queue_goes_on(facts):
    oom = facts["oom"]
    assert (oom["state"], oom["status"]) == ("err", "killed: out of memory (limit 40M)")
    assert usage(oom)["oom_kills"] == 1 and usage(oom)["memory_peak_kb"] == 40 * 1024
    # the other runs of the queue, one of them after the kill, by the same daemon
    assert (facts["small"]["state"], facts["lim_after"]["state"]) == ("done", "done")
    assert facts["lim_pids"][0] == facts["lim_pids"][1] != "0"


def test_tasks_max_refuses_forks(facts):
    # tasks_max 8: the script itself and 7 children; the other 13 forks fail
    assert (facts["forks"]["state"], facts["forks"]["status"]) == ("done", "forks 7 refused 13")
    assert usage(facts["forks"])["tasks_peak"] == 8


def test_peak_memory_of_a_200_mb_allocation_is_within_10_percent(facts):
    peak_kb = usage(facts["peak"])["memory_peak_kb"]
    assert abs(peak_kb * 1024 - 200 * MB) <= 0.1 * 200 * MB, peak_kb
    assert usage(facts["peak"])["cpu_s"] > 0


def test_cpu_quota_holds_a_busy_run_to_its_share(facts):
    # a message's own cpu_quota of 20 % on a queue with message_limits: 2 s of spinning
    spin = facts["spin"]
    [end] = [e for e in spin["timeline"] if e["ev"] == "exit"]
    assert spin["state"] == "done" and end["run_s"] >= 2
    assert usage(spin)["cpu_s"] <= 0.3 * end["run_s"], (usage(spin), end)


def test_queue_memory_max_is_in_systemd_and_enforced(facts):
    assert facts["whole_memory_max"] == str(128 * MB)
    # a run past it is killed by the OOM killer of the unit's cgroup; the queue goes on
    assert (facts["whole"]["state"], facts["whole"]["status"]) == (
        "err", "killed: out of memory (queue limit 128M)")
    assert "oom_kill 1" in facts["whole_events"]
    assert facts["whole_after"]["state"] == "done"
    assert facts["whole_pids"][0] == facts["whole_pids"][1] != "0"



def test_a_memory_need_is_held_by_the_kernel_as_the_runs_limit(facts):
    # a queue with a memory budget and no message_limits: rq-scan delegated its cgroup
    oom, ok = facts["need_oom"], facts["need_ok"]
    assert (oom["state"], oom["status"]) == ("err", "killed: out of memory (limit 40M)")
    assert usage(oom)["oom_kills"] == 1
    assert ok["state"] == "done" and usage(ok)["oom_kills"] == 0
