"""Queue and run limits: their checks, the tightening rule, and the drop-in
rq-scan writes for rq@<queue>.service (the systemd enabler with a recording
systemctl stand-in; the real systemd reads it in tests/system/test_scan_systemd.py)."""

from __future__ import annotations

import pytest
from test_scan_enabler import LOG, finished, systemctl  # noqa: F401 (a fixture)

from rqsys import config
from rqsys.errors import ConfigError
from rqsys.run import resources
from rqsys.scan import enabler


def test_sizes_and_quotas_are_read_as_systemd_reads_them():
    assert resources.size_bytes("2G") == 2 << 30
    assert resources.size_bytes("512") == 512
    assert resources.size_bytes("100M") == 100 << 20
    assert resources.quota_percent("150%") == 150


def test_a_message_may_only_tighten_its_queues_limits():
    queue = {"memory_max": "1G", "runtime_max": 600, "cpu_quota": "50%"}
    message = {"memory_max": "2G", "runtime_max": 5, "tasks_max": 10}
    assert resources.run_limits(queue, message) == {
        "memory_max": "1G", "cpu_quota": "50%", "tasks_max": 10, "runtime_max": 5}
    assert resources.run_limits(None, None) == {}


@pytest.mark.parametrize(("cfg", "field"), [
    ({"limits": {"memory_max": "2X"}}, "limits/memory_max"),
    ({"limits": {"cpu_quota": "150"}}, "limits/cpu_quota"),
    ({"limits": {"tasks_max": 0}}, "limits/tasks_max"),
    ({"limits": {"io_weight": 10001}}, "limits/io_weight"),
    ({"limits": {"memory": "2G"}}, "limits"),
    ({"message_limits": {"runtime_max": 0}}, "message_limits/runtime_max"),
    ({"message_limits": {"io_weight": 5}}, "message_limits"),
])
def test_bad_limits_are_refused_naming_the_field(cfg, field):
    with pytest.raises(ConfigError, match=f"^entry: {field}: "):
        config.queue_config("q", "/bin/true", cfg, "entry")


def test_bad_message_limits_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="^msg: limits/memory_max: "):
        config.validate("message", {"limits": {"memory_max": "-1"}}, "msg")


def test_rq_scan_writes_reloads_and_removes_the_drop_in(systemctl, layout, make_queue,  # noqa: F811
                                                        tmp_path):
    # Given a queue with limits, and the systemd enabler
    path, calls = systemctl
    make_queue("lim", "exit 0", limits={"memory_max": "2G", "cpu_quota": "150%",
                                         "tasks_max": 256, "io_weight": 50})
    units = tmp_path / "units"
    sd = enabler.SystemdEnabler(LOG, path, layout=layout, unit_dir=units)
    # When it is enabled, the drop-in is written and systemd reloaded first
    finished(sd, sd.enable(["lim"]))
    dropin = units / "rq@lim.service.d" / resources.DROP_IN_NAME
    assert dropin.read_text().splitlines()[2:] == [
        "[Service]", "MemoryMax=2G", "CPUQuota=150%", "TasksMax=256", "IOWeight=50"]
    # And a reload with the same limits does not reload systemd again
    finished(sd, sd.reload("lim"))
    # When the limits are removed from the config, so is the drop-in
    make_queue("lim", "exit 0", num_workers=2)
    finished(sd, sd.reload("lim"))
    assert not dropin.exists() and not dropin.parent.exists()
    assert calls.read_text().splitlines() == [
        "daemon-reload", "enable --now rq@lim.socket",
        "try-reload-or-restart rq@lim.service",
        "daemon-reload", "try-reload-or-restart rq@lim.service"]


def test_message_limits_delegate_the_cgroup_subtree_to_the_daemon():
    # a queue with message_limits runs its scripts in sub-cgroups (rqsys.run.cgroups)
    assert resources.drop_in(None, delegate=True).splitlines()[2:] == [
        "[Service]", "Delegate=memory cpu pids", "ProtectControlGroups=no",
        "Environment=RQ_CGROUP_DELEGATED=1"]
    assert resources.drop_in({"tasks_max": 9}, delegate=False).splitlines()[2:] == [
        "[Service]", "TasksMax=9"]
    assert resources.drop_in(None) == ""
