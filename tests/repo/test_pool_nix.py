"""The NixOS module's pool options (nix/module.nix evaluated against the stubs, as
tests/repo/test_nix.py does): a pool queue's config and boot-time service, the NATS
servers in config.json, nats-server through nixpkgs' services.nats, the
package with nats-py, refusals naming the option; and the generated configs
run a real pool queue against a real nats-server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from nats_util import LocalNats, nats_available
from test_nix import entry_files, evaluate, evaluation_error

from rqsys import config
from rqsys.pool.settings import from_configs
from rqsys.scan import scandir

POOLED = {
    "enable": True, "host": "a.example",
    "nats": {"servers": ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"],
             "credsFile": "/run/secrets/pool.creds", "tls": {"ca": "/etc/nats/ca.pem"},
             "server": {"enable": True, "routes": ["nats-route://10.0.0.2:6222",
                                                   "nats-route://10.0.0.3:6222"],
                        "openFirewall": True}},
    "queues": {"tc": {"script": "/srv/tc", "numWorkers": 4,
                      "pool": {"name": "transcode", "ackWait": 60}},
               "plain": {"script": "/srv/plain"}},
}


@pytest.fixture(scope="module")
def pooled() -> dict[str, Any]:
    return evaluate(POOLED)


def public_config(out: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(out["systemd"]["services"]["rq-config"]["restartTriggers"][0]["text"]))


def queue_config(out: dict[str, Any], name: str) -> dict[str, Any]:
    files = entry_files(out["services"]["rq"]["generated"]["scandir"][name])
    return dict(json.loads(files["config.json"]["text"]))


def test_a_pool_queue_config_is_what_rqsys_reads(pooled: dict[str, Any],
                                                 tmp_path: Path) -> None:
    sysconfig = config.validate("config", public_config(pooled), "config.json")
    assert sysconfig["nats"] == {"servers": ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"],
                                 "creds": "/run/secrets/pool.creds", "connect_timeout": 3,
                                 "tls": {"ca": "/etc/nats/ca.pem"}}
    entry = tmp_path / "tc"
    entry.mkdir()
    (entry / "config.json").write_text(json.dumps(queue_config(pooled, "tc")))
    (entry / "run").write_text("#!/bin/sh\n")
    (entry / "run").chmod(0o755)
    queue = scandir.entry_config("tc", entry)
    settings = from_configs(queue, sysconfig)
    assert (settings.pool, settings.replicas, settings.ack_wait) == ("transcode", 3, 60)
    assert settings.servers == ("nats://10.0.0.1:4222", "nats://10.0.0.2:4222")
    assert "pool" not in queue_config(pooled, "plain")


def test_a_pool_queue_runs_from_boot_after_the_local_nats(pooled: dict[str, Any]) -> None:
    services = pooled["systemd"]["services"]
    tc = services["rq@tc"]  # it repeats the shared rq@ drop-in: NixOS names both overrides.conf
    assert tc["overrideStrategy"] == "asDropin" and tc["wantedBy"] == ["multi-user.target"]
    assert tc["after"] == tc["wants"] == ["rq-config.service", "nats.service"]
    assert tc["serviceConfig"]["User"] == "rq" and tc["environment"] == {"RQ_ROOT": "/var/lib/rq"}
    assert "rq@plain" not in services  # a plain queue stays socket-activated
    assert pooled["environment"]["systemPackages"][0]["args"] == {"withPool": True}


def test_nats_server_is_clustered_with_jetstream(pooled: dict[str, Any]) -> None:
    assert pooled["services"]["nats"] == {
        "enable": True, "jetstream": True, "serverName": "a.example", "port": 4222,
        "settings": {"cluster": {"name": "rq", "port": 6222,
                                 "routes": ["nats-route://10.0.0.2:6222",
                                            "nats-route://10.0.0.3:6222"]},
                     "http_port": 8222}}
    assert pooled["networking"]["firewall"]["allowedTCPPorts"] == [4222, 6222]


def test_without_pools_nothing_of_nats() -> None:
    out = evaluate({"enable": True, "queues": {"plain": {"script": "/x"}}})
    assert "nats" not in public_config(out) and "nats" not in out.get("services", {})
    assert out["environment"]["systemPackages"][0]["args"] == {"withPool": False}
    assert "networking" not in out


def test_a_local_server_is_the_default_server() -> None:
    out = evaluate({"enable": True, "nats": {"server": {"enable": True, "name": "b"}},
                    "queues": {"q": {"script": "/x", "pool": {"name": "p", "replicas": 1}}}})
    assert public_config(out)["nats"]["servers"] == ["nats://127.0.0.1:4222"]
    assert out["services"]["nats"]["serverName"] == "b"


@pytest.mark.parametrize(("settings", "message"), [
    ({"queues": {"q": {"script": "/x", "pool": {"name": "a b"}}}},
     "services.rq.queues.q.pool.name' has a value of the wrong type"),
    ({"queues": {"q": {"script": "/x", "pool": {"name": "p", "replicas": 9}}}},
     "services.rq.queues.q.pool.replicas' has a value of the wrong type"),
    ({"nats": {"servers": ["http://x:4222"]}}, "services.rq.nats.servers.[0]' has a value"),
    ({"nats": {"server": {"port": 70000}}}, "services.rq.nats.server.port' has a value"),
])
def test_bad_pool_values_are_refused(settings: dict[str, Any], message: str) -> None:
    assert message in evaluation_error({"enable": True, **settings})


@pytest.mark.parametrize(("settings", "message"), [
    ({"queues": {"q": {"script": "/x", "pool": {"name": "p"}}}},
     "pool needs services.rq.nats.servers or services.rq.nats.server.enable (queues: q)"),
    ({"nats": {"server": {"enable": True}}}, "services.rq.nats.server needs a name"),
    ({"nats": {"credsFile": "/nix/store/abc-pool.creds"}}, "credsFile is in the Nix store"),
])
def test_inconsistent_pool_settings_fail_an_assertion(settings: dict[str, Any],
                                                      message: str) -> None:
    failed = evaluate({"enable": True, **settings})["failedAssertions"]
    assert len(failed) == 1 and message in failed[0], failed


def test_the_generated_pool_queue_runs_on_a_real_nats(layout, daemon, tmp_path: Path) -> None:
    # Given the module's configs for a pool queue and a real nats-server
    need(nats_available(), "nats-server (Debian package nats-server)")
    server = LocalNats(tmp_path / "nats")
    try:
        out = evaluate({"enable": True, "host": "127.0.0.1", "nats": {"servers": [server.url]},
                        "queues": {"nq": {"script": "/x",
                                          "pool": {"name": "nixpool", "replicas": 1}}}})
        layout.config_file.write_text(json.dumps(public_config(out)))
        entry = tmp_path / "nq"
        entry.mkdir()
        (entry / "config.json").write_text(json.dumps(queue_config(out, "nq")))
        (entry / "run").write_text('#!/bin/sh\necho "done pooled $RQ_PARAM1" >&3\n')
        (entry / "run").chmod(0o755)
        scandir.install_queue(layout, "nq", entry)
        # When a message is sent to its daemon, it goes through the pool and runs
        proc = daemon("nq")
        msg_id = proc.call("create", msg={"param1": "nix"})["msg_id"]
        got = wait_for(lambda: (g := proc.call("get", msg_id=msg_id))["state"] == "done"
                       and g, 20, "done")
        assert got["status"] == "pooled nix"
        assert proc.call("pool")["pool"] == "nixpool"
    finally:
        server.stop()
