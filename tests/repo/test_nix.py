"""The Nix files: every one parses, the lock is well formed, and nix/module.nix
evaluated (nix-instantiate --eval --strict, against nix/tests/*-stub.nix
since there is no nixpkgs here) generates the sockets, services, users,
tmpfiles and scandir entries its options ask for.  A generated scandir entry
is then run by a real queue daemon.  A NixOS VM test cannot run here (no
nixpkgs, no network); it lives in flake.nix's checks.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, need, wait_for

from rqsys import config
from rqsys.run import credentials, unituser
from rqsys.run.identity import dynamic_name
from rqsys.scan import scandir
from rqsys.store import QueueStore
from rqsys.triggers import listing
from rqsys.wire import roles

EVAL = REPO / "nix" / "tests" / "eval-module.nix"
NIX_FILES = sorted([REPO / "flake.nix", *(REPO / "nix").rglob("*.nix")])
STATE = "/srv/rq"


def nix_instantiate(*args: str) -> subprocess.CompletedProcess[str]:
    need(shutil.which("nix-instantiate") is not None, "nix-instantiate (Debian nix-bin)")
    return subprocess.run(["nix-instantiate", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def evaluate(settings: dict[str, Any]) -> dict[str, Any]:
    done = nix_instantiate("--eval", "--strict", "--json", str(EVAL),
                           "--argstr", "settingsJson", json.dumps(settings))
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def evaluation_error(settings: dict[str, Any]) -> str:
    done = nix_instantiate("--eval", "--strict", "--json", str(EVAL),
                           "--argstr", "settingsJson", json.dumps(settings))
    assert done.returncode != 0, f"accepted: {done.stdout[:300]}"
    return done.stderr


FULL = {
    "enable": True,
    "stateDir": STATE,
    "host": "queue.example.org",
    "web": {"port": 8080, "address": "127.0.0.1", "relativeRoot": "/rq/",
            "basicAuthFile": "/run/secrets/rq-auth.json"},
    "queues": {
        "hello": {"script": "/srv/scripts/hello/run", "numWorkers": 3,
                  "execPrefix": "nice -n 5", "envVars": {"GREETING": "hi"},
                  "coalesceParams": [1], "blockingParams": [2, 3],
                  "settings": {"stop_grace": 30}, "form": {"default": "shown"}},
        "resize": {"script": "/srv/scripts/resize"},
    },
    "timers": {"nightly": {"period": 86400, "msg": {"dest": "hello", "param1": "night"}},
               "weekdays": {"calendar": "Mon..Fri *-*-* 02:00:00", "timezone": "Europe/Berlin",
                            "jitter": 300, "msg": {"dest": "hello"}}},
    "triggers": {"deploy": {"webhook": {"secret": {"credential": "gh"}, "signature": "github",
                                        "delivery_header": "X-GitHub-Delivery"},
                            "msg": {"dest": "hello"}, "params": {"param1": "$.ref"}},
                 "incoming": {"files": {"path": "/srv/incoming", "glob": "*.csv"},
                              "msg": {"dest": "resize"}, "then": {"move": "/srv/done"}}},
}


@pytest.fixture(scope="module")
def full() -> dict[str, Any]:
    return evaluate(FULL)


def entry_files(entry: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e["path"] for e in entry["entries"]}


# ------------------------------------------------------------------ parsing
@pytest.mark.parametrize("path", NIX_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_nix_file_parses(path: Path) -> None:
    done = nix_instantiate("--parse", str(path))
    assert done.returncode == 0, done.stderr


def test_a_syntax_error_is_caught(tmp_path: Path) -> None:
    bad = tmp_path / "bad.nix"
    bad.write_text("{ a = 1; b = ; }\n")
    done = nix_instantiate("--parse", str(bad))
    assert done.returncode != 0 and "syntax error" in done.stderr


def test_flake_lock_pins_the_input_flake_nix_names() -> None:
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    assert lock["nodes"]["root"]["inputs"] == {"nixpkgs": "nixpkgs"}
    node = lock["nodes"]["nixpkgs"]
    assert re.fullmatch(r"[0-9a-f]{40}", node["locked"]["rev"])
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", node["locked"]["narHash"])
    url = re.search(r'inputs\.nixpkgs\.url = "github:([^/]+)/([^/]+)/([^"]+)"',
                    (REPO / "flake.nix").read_text())
    assert url is not None
    original = node["original"]
    assert (original["owner"], original["repo"], original["ref"]) == url.groups()


# ------------------------------------------------------------------ module
def test_each_queue_gets_an_enabled_socket_drop_in(full: dict[str, Any]) -> None:
    sockets = full["systemd"]["sockets"]
    instances = {name for name in sockets if name.startswith("rq@") and name != "rq@"}
    assert instances == {"rq@hello", "rq@resize"}
    for name in instances:  # its overrides.conf hides the template's: SocketGroup again
        assert sockets[name] == {"overrideStrategy": "asDropin", "wantedBy": ["sockets.target"],
                                 "socketConfig": {"SocketGroup": "rq"}}
    assert sockets["rq@"]["socketConfig"] == {"SocketGroup": "rq"}
    assert sockets["rq-relay-worker"] == {"socketConfig": {"SocketGroup": "rq"}}


def test_services_are_drop_ins_with_state_dir_and_user(full: dict[str, Any]) -> None:
    services = full["systemd"]["services"]
    assert set(services) == {"rq@", "rq-scan", "rq-web", "rq-config", "rq-relay-worker"}
    for name in ("rq@", "rq-scan", "rq-web", "rq-relay-worker"):
        assert services[name]["environment"] == {"RQ_ROOT": STATE}
        assert services[name]["serviceConfig"]["ReadWritePaths"] == ["", STATE]
        assert "rq-config.service" in services[name]["after"]
        assert "ExecStart" not in services[name]["serviceConfig"]  # upstream's stays
    for name in ("rq@", "rq-web", "rq-relay-worker"):
        assert services[name]["serviceConfig"]["User"] == "rq"
    assert services["rq@"]["overrideStrategy"] == "asDropin"
    assert full["systemd"]["packages"][0]["name"] == "rqsys"


def test_web_socket_listens_where_asked(full: dict[str, Any]) -> None:
    web = full["systemd"]["sockets"]["rq-web"]
    assert web["listenStreams"] == ["", "127.0.0.1:8080"]
    assert web["wantedBy"] == ["sockets.target"]


def test_system_user_and_group_are_created(full: dict[str, Any]) -> None:
    assert full["users"]["users"]["rq"]["isSystemUser"] is True
    assert full["users"]["users"]["rq"]["home"] == STATE
    assert full["users"]["groups"] == {"rq": {}, "rq-web": {}}


def test_scandir_entries_are_linked_by_tmpfiles(full: dict[str, Any]) -> None:
    rules = full["systemd"]["tmpfiles"]["rules"]
    entries = full["services"]["rq"]["generated"]["scandir"]
    for name, entry in entries.items():
        assert f"L+ {STATE}/scandir/{name} - - - - {entry['storePath']}" in rules
    assert f"d {STATE}/queue 0750 rq rq -" in rules
    assert entry_files(entries["resize"])["run"] == "/srv/scripts/resize"
    assert set(entry_files(entries["hello"])) == {"run", "config.json", "form.json"}


def test_generated_queue_config_is_what_rqsys_reads(full: dict[str, Any], tmp_path: Path) -> None:
    # Given the generated entry written out as tmpfiles would link it
    entry = full["services"]["rq"]["generated"]["scandir"]["hello"]
    files = entry_files(entry)
    directory = tmp_path / "hello"
    directory.mkdir()
    (directory / "config.json").write_text(files["config.json"]["text"])
    (directory / "form.json").write_text(files["form.json"]["text"])
    run = directory / "run"
    run.write_text("#!/bin/sh\n")
    run.chmod(0o755)
    # When rqsys reads it as a scandir entry
    effective = scandir.entry_config("hello", directory)
    # Then every option arrived in the effective config
    assert effective["num_workers"] == 3
    assert effective["exec_prefix"] == "nice -n 5"
    assert effective["env_vars"] == {"GREETING": "hi"}
    assert effective["coalesce_params"] == [1]
    assert effective["blocking_params"] == [2, 3]
    assert effective["stop_grace"] == 30
    config.validate("form", json.loads(files["form.json"]["text"]), "form.json")


def test_generated_entry_runs_in_a_real_daemon(layout, daemon, tmp_path: Path) -> None:
    # Given the entry the module generates for a queue with two workers
    out = evaluate({"enable": True, "queues": {"greet": {
        "script": "/unused", "numWorkers": 2, "envVars": {"GREETING": "hello"}}}})
    files = entry_files(out["services"]["rq"]["generated"]["scandir"]["greet"])
    entry = tmp_path / "greet"
    entry.mkdir()
    (entry / "config.json").write_text(files["config.json"]["text"])
    run = entry / "run"
    run.write_text('#!/bin/sh\necho "done $GREETING $RQ_PARAM1" >&3\n')
    run.chmod(0o755)
    scandir.install_queue(layout, "greet", entry)
    # When a message is sent to its real daemon
    proc = daemon("greet")
    msg_id = proc.call("create", msg={"param1": "nix"})["msg_id"]
    # Then the script ran with the module's environment and said done
    wait_for(lambda: proc.call("state", msg_id=msg_id)["state"] == "done", what="done")
    assert QueueStore(layout.queue_dir("greet")).read_status("done", msg_id) == "hello nix"
    assert proc.call("counts")["num_workers"] == 2


def test_timer_file_is_a_valid_timer(full: dict[str, Any]) -> None:
    timer_file = full["services"]["rq"]["generated"]["timers"]["nightly"]
    rule = f"L+ {STATE}/timers/nightly.json - - - - {timer_file['storePath']}"
    assert rule in full["systemd"]["tmpfiles"]["rules"]
    timer = config.validate("timer", json.loads(timer_file["text"]), "timer")
    assert timer == {"period": 86400, "msg": {"dest": "hello", "param1": "night"}}
    weekdays = json.loads(full["services"]["rq"]["generated"]["timers"]["weekdays"]["text"])
    assert config.validate("timer", weekdays, "timer") == {
        "calendar": "Mon..Fri *-*-* 02:00:00", "timezone": "Europe/Berlin", "jitter": 300,
        "persistent": True, "unique": True, "msg": {"dest": "hello"}}


def test_trigger_files_are_linked_and_rqsys_reads_them(full: dict[str, Any], layout) -> None:
    # Given each generated trigger file, linked into triggers/ as tmpfiles' L+ does
    files = full["services"]["rq"]["generated"]["triggers"]
    rules = full["systemd"]["tmpfiles"]["rules"]
    assert f"d {STATE}/triggers 0750 rq rq -" in rules
    assert f"d {STATE}/triggers/.state 0750 rq rq -" in rules
    (layout.root / "triggers").mkdir()
    for name, made in files.items():
        assert f"L+ {STATE}/triggers/{name}.json - - - - {made['storePath']}" in rules
        stored = layout.root / f"store-{name}.json"
        stored.write_text(made["text"])
        (layout.root / "triggers" / f"{name}.json").symlink_to(stored)
    # Then rqsys takes them as given: their kinds and queues, none refused
    assert json.loads(files["deploy"]["text"]) == FULL["triggers"]["deploy"]
    listed = {t["name"]: (t.get("kind"), t.get("dest"), t.get("error"))
              for t in listing.list_triggers(layout)}
    assert listed == {"deploy": ("webhook", "hello", "no queue named hello"),
                      "incoming": ("files", "resize", "no queue named resize")}


def test_secrets_stay_out_of_the_store(full: dict[str, Any]) -> None:
    rq_config = full["systemd"]["services"]["rq-config"]
    public = json.loads(rq_config["restartTriggers"][0]["text"])
    assert "basic_auth" not in public
    assert config.validate("config", public, "config.json") == {
        "port": 8080, "addr": "127.0.0.1", "relative_root": "/rq/", "host": "queue.example.org"}
    script = rq_config["script"]
    assert "--slurpfile auth /run/secrets/rq-auth.json" in script
    assert 'mv "$dir/config.json.tmp" "$dir/config.json"' in script
    assert f"dir={STATE}/config" in script


def test_without_basic_auth_the_public_config_is_copied() -> None:
    out = evaluate({"enable": True})
    script = out["systemd"]["services"]["rq-config"]["script"]
    assert "jq" not in script and "cp /nix/store/" in script


def test_custom_user_creates_no_account() -> None:
    out = evaluate({"enable": True, "user": "svc", "group": "svc", "web": {"enable": False}})
    assert out["users"] == {"users": {}, "groups": {"rq-web": {}}}  # the console's, always
    assert out["systemd"]["services"]["rq@"]["serviceConfig"]["User"] == "svc"
    assert out["systemd"]["sockets"]["rq@"]["socketConfig"]["SocketGroup"] == "svc"
    assert "rq-web" not in out["systemd"]["sockets"]
    assert "rq-web" not in out["systemd"]["services"]


def test_disabled_module_generates_nothing() -> None:
    out = evaluate({"queues": {"hello": {"script": "/x"}}})
    assert out == {"failedAssertions": []}


# ------------------------------------------------------------------ users, credentials, roles
RQSYS = "/nix/store/00000000000000000000000000000000-rqsys/bin/rqsys"
IDENTITY_KEYS = ("DynamicUser", "User", "Group", "RemoveIPC", "SupplementaryGroups",
                 "ExecStartPre")
OWN = {"enable": True, "stateDir": STATE, "queues": {
    "named": {"script": "/srv/named", "user": "nobody",
              "credentials": {"token": "/run/secrets/100%", "db": {"encrypted": "/etc/c/db"}}},
    "dyn": {"script": "/srv/dyn", "user": "dynamic"},
    "plain": {"script": "/srv/plain"}}}


@pytest.fixture(scope="module")
def own() -> dict[str, Any]:
    return evaluate(OWN)


def unit_lines(section: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """A NixOS serviceConfig's lines for ``keys`` (a list: one line per item)."""
    lines = []
    for key in keys:
        value = section.get(key)
        for item in value if isinstance(value, list) else [] if value is None else [value]:
            lines.append(f"{key}={item}")
    return lines


def rq_scan_lines(text: str) -> list[str]:
    """The settings of a drop-in rq-scan writes (its header and [Service] left out)."""
    return [line for line in text.splitlines() if line and not line.startswith(("#", "["))]


def test_a_named_user_gets_rq_scans_drop_in(own: dict[str, Any], tmp_path: Path) -> None:
    section = own["systemd"]["services"]["rq@named"]["serviceConfig"]
    wanted = rq_scan_lines(unituser.drop_in("named", {"user": "nobody"}, tmp_path, RQSYS))
    primary = grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name
    # rq-scan names the primary group; the module's empty Group= leaves it to systemd
    assert f"Group={primary}" in wanted
    assert sorted(unit_lines(section, IDENTITY_KEYS)) == sorted(
        "Group=" if line == f"Group={primary}" else line for line in wanted)
    assert section["RemoveIPC"] == "no" and section["SupplementaryGroups"] == ["rq"]


def test_a_dynamic_user_gets_rq_scans_drop_in(own: dict[str, Any], tmp_path: Path) -> None:
    section = own["systemd"]["services"]["rq@dyn"]["serviceConfig"]
    wanted = rq_scan_lines(unituser.drop_in("dyn", {"user": "dynamic"}, tmp_path, RQSYS))
    assert wanted == ["DynamicUser=yes", "User=rq-dyn", "SupplementaryGroups=rq",
                      f"ExecStartPre=+{RQSYS} queue-owner %i"]
    keys = tuple(k for k in IDENTITY_KEYS if k != "Group")
    assert sorted(unit_lines(section, keys)) == sorted(wanted)
    assert section["Group"] == "rq"  # the template's, which rq-scan's drop-in keeps


def test_a_queues_drop_in_repeats_the_templates(own: dict[str, Any]) -> None:
    # NixOS names both drop-ins overrides.conf; systemd reads only the instance's
    services = own["systemd"]["services"]
    assert {n for n in services if n.startswith("rq@")} == {"rq@", "rq@named", "rq@dyn"}
    for name in ("rq@named", "rq@dyn"):
        assert services[name]["overrideStrategy"] == "asDropin"
        assert services[name]["environment"] == services["rq@"]["environment"]
        assert services[name]["serviceConfig"]["ReadWritePaths"] == ["", STATE]
        assert services[name]["after"] == ["rq-config.service"]
        assert "wantedBy" not in services[name]  # socket-activated, as before
    pooled = evaluate({"enable": True, "nats": {"servers": ["nats://10.0.0.1:4222"]},
                       "queues": {"p": {"script": "/x", "user": "nobody",
                                        "pool": {"name": "p"}}}})["systemd"]["services"]["rq@p"]
    assert pooled["wantedBy"] == ["multi-user.target"]
    assert pooled["serviceConfig"]["User"] == "nobody"


def test_credentials_reach_config_and_drop_in(own: dict[str, Any], tmp_path: Path) -> None:
    files = entry_files(own["services"]["rq"]["generated"]["scandir"]["named"])
    entry = tmp_path / "named"
    entry.mkdir()
    (entry / "config.json").write_text(files["config.json"]["text"])
    (entry / "run").write_text("#!/bin/sh\n")
    (entry / "run").chmod(0o755)
    effective = scandir.entry_config("named", entry)
    assert effective["user"] == "nobody"
    assert effective["credentials"] == {"token": "/run/secrets/100%",
                                        "db": {"encrypted": "/etc/c/db"}}
    section = own["systemd"]["services"]["rq@named"]["serviceConfig"]
    keys = ("LoadCredential", "LoadCredentialEncrypted")
    assert sorted(unit_lines(section, keys)) == sorted(
        rq_scan_lines(credentials.drop_in(effective)))
    assert section["LoadCredential"] == ["token:/run/secrets/100%%"]
    assert "credentials" not in json.loads(entry_files(
        own["services"]["rq"]["generated"]["scandir"]["dyn"])["config.json"]["text"])


def test_the_consoles_group_and_the_shared_directories(own: dict[str, Any]) -> None:
    assert own["users"]["groups"]["rq-web"] == {}
    web = own["systemd"]["services"]["rq-web"]["serviceConfig"]
    assert web["SupplementaryGroups"] == ["rq-web"] and web["User"] == "rq"
    rules = own["systemd"]["tmpfiles"]["rules"]
    for name in ("audit", "batches"):
        assert f"d {STATE}/{name} 2770 rq rq -" in rules


def test_a_dynamic_name_nix_writes_is_rqsys_own() -> None:
    assert dynamic_name("q" * 28) == "rq-" + "q" * 28  # what the module writes
    assert dynamic_name("q" * 29) != "rq-" + "q" * 29  # a crc32: refused below


# ------------------------------------------------------------------ basic auth and roles
def write_config(tmp_path: Path, users: dict[str, Any], auth: dict[str, Any]
                 ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run rq-config.service's script (its store files written out, the real jq)."""
    need(shutil.which("jq") is not None, "jq")
    (tmp_path / "auth.json").write_text(json.dumps(auth))
    me, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    out = evaluate({"enable": True, "stateDir": str(tmp_path / "state"), "user": me,
                    "group": group, "web": {"basicAuthFile": str(tmp_path / "auth.json"),
                                            "users": users}})
    rq_config = out["systemd"]["services"]["rq-config"]
    script = rq_config["script"].replace(
        "/nix/store/00000000000000000000000000000000-jq/bin/jq", str(shutil.which("jq")))
    for stored in rq_config["restartTriggers"]:
        local = tmp_path / stored["name"]
        local.write_text(stored["text"])
        script = script.replace(stored["storePath"], str(local))
    assert "/nix/store" not in script
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    return done, tmp_path / "state" / "config" / "config.json"


def test_web_users_get_their_roles_and_hashes(tmp_path: Path) -> None:
    auth = {"realm": "rq", "users": {"ann": "$argon2id$ann", "bob": "$argon2id$bob",
                                     "cyd": {"password": "$argon2id$cyd", "role": "viewer"}}}
    done, written = write_config(tmp_path, {"ann": {"role": "viewer", "queues": ["etl-*"]},
                                            "cyd": {}}, auth)
    assert done.returncode == 0, done.stderr
    merged = config.validate("config", json.loads(written.read_text()), "config.json")
    assert merged["basic_auth"]["users"] == {
        "ann": {"password": "$argon2id$ann", "role": "viewer", "queues": ["etl-*"]},
        "bob": "$argon2id$bob",  # not in web.users: a bare hash, an admin
        "cyd": {"password": "$argon2id$cyd", "role": "admin"}}  # the module's role wins
    accounts = roles.accounts(merged["basic_auth"])
    assert accounts["ann"].may("viewer", "etl-a") and not accounts["ann"].may("viewer", "x")
    assert not accounts["ann"].may("operator", "etl-a") and accounts["bob"].may("admin", "x")


def test_a_web_user_without_a_hash_fails_rq_config(tmp_path: Path) -> None:
    written = tmp_path / "state" / "config" / "config.json"
    written.parent.mkdir(parents=True)
    written.write_text('{"old": true}')
    done, _ = write_config(tmp_path, {"ann": {}, "eve": {"role": "viewer"}},
                           {"realm": "rq", "users": {"ann": "$argon2id$ann",
                                                     "eve": {"role": "admin"}}})
    assert done.returncode != 0
    assert "services.rq.web.users: no password hash for eve in " in done.stderr
    assert json.loads(written.read_text()) == {"old": True}  # never a user without one


def test_a_basic_auth_file_without_users_fails_rq_config(tmp_path: Path) -> None:
    done, written = write_config(tmp_path, {}, {"realm": "rq"})
    assert done.returncode != 0 and 'not a JSON object with "users"' in done.stderr
    assert not written.exists()


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("settings", "message"), [
    ({"queues": {"q": {"script": "/x", "numWorkers": 0}}},
     "services.rq.queues.q.numWorkers' has a value of the wrong type"),
    ({"queues": {"q": {"script": "/x", "coalesceParams": [5]}}},
     "services.rq.queues.q.coalesceParams.[0]' has a value of the wrong type"),
    ({"queues": {"q": {"script": "relative/run"}}},
     "services.rq.queues.q.script' has a value of the wrong type"),
    ({"queues": {"q": {}}}, "services.rq.queues.q.script' is used but not defined"),
    ({"timers": {"t": {"period": 30, "msg": {"dest": "q"}}}},
     "services.rq.timers.t.period' has a value of the wrong type"),
    ({"web": {"relativeRoot": "rq"}}, "services.rq.web.relativeRoot' has a value"),
    ({"triggers": {"t": "/srv/t.json"}}, "services.rq.triggers.t' has a value of the wrong type"),
    ({"web": {"port": 70000}}, "services.rq.web.port' has a value"),
    ({"queue": {}}, "services.rq.queue' does not exist"),
    ({"generated": {}}, "services.rq.generated' is read-only"),
    ({"queues": {"q": {"script": "/x", "user": "no one"}}},
     "services.rq.queues.q.user' has a value of the wrong type"),
    ({"queues": {"q": {"script": "/x", "credentials": {"t": "relative/t"}}}},
     "services.rq.queues.q.credentials.t' has a value of the wrong type"),
    ({"queues": {"q": {"script": "/x", "credentials": {"t": {"path": "/t"}}}}},
     "services.rq.queues.q.credentials.t.path' does not exist"),
    ({"queues": {"q": {"script": "/x", "credentials": {"t": {"encrypted": 1}}}}},
     "services.rq.queues.q.credentials.t.encrypted' has a value of the wrong type"),
    ({"web": {"users": {"ann": {"role": "root"}}}}, "services.rq.web.users.ann.role' has a"),
    ({"web": {"users": {"ann": {"queues": [""]}}}}, "services.rq.web.users.ann.queues.[0]'"),
])
def test_bad_option_values_are_refused(settings: dict[str, Any], message: str) -> None:
    assert message in evaluation_error({"enable": True, **settings})


@pytest.mark.parametrize(("settings", "message"), [
    ({"queues": {"q": {"script": "/x", "envVars": {"RQ_HOST": "x"}}}},
     "envVars cannot set RQ_* variables (queues: q)"),
    ({"queues": {"bad name": {"script": "/x"}}}, "invalid queue name(s): bad name"),
    ({"triggers": {"bad.name": {"webhook": {}}}}, "invalid trigger name(s): bad.name"),
    ({"timers": {"t": {"period": 60, "msg": {"param1": "x"}}}}, "needs a dest"),
    ({"timers": {"t": {"period": 60, "cron": "* * * * *", "msg": {"dest": "q"}}}},
     "needs exactly one of period, calendar and cron (timers: t)"),
    ({"timers": {"t": {"msg": {"dest": "q"}}}}, "needs exactly one of period"),
    ({"timers": {"t": {"period": 60, "msg": {"dest": "q", "colour": "red"}}}}, "needs a dest"),
    ({"web": {"basicAuthFile": "/nix/store/abc-auth.json"}}, "is in the Nix store"),
    ({"web": {"users": {"ann": {}}}},
     "services.rq.web.users needs services.rq.web.basicAuthFile, which holds their password"),
    ({"queues": {"q" * 29: {"script": "/x", "user": "dynamic"}}},
     "needs a queue name of at most 28 characters: rqsys shortens a longer rq-<name> with a "
     "crc32, which Nix cannot compute"),
    ({"queues": {"q": {"script": "/x", "credentials": {"t": {"encrypted": "/nix/store/a-t"}}}}},
     "credentials are in the Nix store, readable by everyone; give paths outside it "
     "(credentials: q.t)"),
    ({"queues": {"q": {"script": "/x", "credentials": {"..": "/run/t"}}}},
     "(credentials: q...)"),
])
def test_inconsistent_settings_fail_an_assertion(settings: dict[str, Any], message: str) -> None:
    failed = evaluate({"enable": True, **settings})["failedAssertions"]
    assert len(failed) == 1 and message in failed[0], failed


# ------------------------------------------------------------------ package
PACKAGE = REPO / "nix" / "tests" / "eval-package.nix"
SUBSTITUTE_SHIM = """
substituteInPlace() {  # stdenv's, reduced to the one flag package.nix uses
    local file=$1; shift
    while [ $# -gt 0 ]; do
        [ "$1" = --replace-quiet ] || { echo "unknown flag $1" >&2; return 1; }
        sed -i "s|$2|$3|g" "$file"; shift 3
    done
}
"""


def package(python_version: str) -> dict[str, Any]:
    done = nix_instantiate("--eval", "--strict", "--json", str(PACKAGE),
                           "--argstr", "pythonVersion", python_version)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize(("version", "asyncore"), [("3.11", False), ("3.12", True),
                                                   ("3.13", True)])
def test_package_depends_on_pyasyncore_from_python_3_12(version: str, asyncore: bool) -> None:
    deps = package(version)["dependencies"]
    assert ("pyasyncore" in deps) is asyncore
    assert {"cffi", "falcon", "waitress", "jsonschema", "pyinotify", "systemd"} <= set(deps)


def test_package_dependencies_match_pyproject() -> None:
    text = (REPO / "pyproject.toml").read_text()
    block = text.split("\ndependencies = [", 1)[1].split("]", 1)[0]
    wanted = {re.split(r"[<>=;\s]", line.strip().strip('",'), maxsplit=1)[0]
              for line in block.splitlines() if line.strip()}
    nix_names = {"systemd-python": "systemd"}
    assert {nix_names.get(n, n) for n in wanted} == set(package("3.12")["dependencies"])


def test_package_builds_man_pages_and_imports_the_cffi_helper() -> None:
    pkg = package("3.12")
    assert pkg["nativeBuildInputs"] == ["scdoc"] and pkg["RQSYS_REQUIRE_MAN"] == "1"
    assert "rqsys._native._rqspawn" in pkg["pythonImportsCheck"]
    assert "cffi" in pkg["build-system"] and pkg["pyproject"] is True


def test_package_post_install_puts_units_with_store_paths(tmp_path: Path) -> None:
    # Given $out as setup.py installs it (units under share/rqsys/units)
    out = tmp_path / "out"
    shutil.copytree(REPO / "units", out / "share" / "rqsys" / "units")
    # When package.nix's postInstall runs on it
    script = SUBSTITUTE_SHIM + package("3.12")["postInstall"]
    done = subprocess.run(["bash", "-euc", script], env={"out": str(out), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    # Then systemd.packages finds every unit, pointing into the store, not /usr
    unit_dir = out / "lib" / "systemd" / "system"
    shipped = sorted(p.name for p in (REPO / "units").iterdir() if p.is_file())
    assert sorted(p.name for p in unit_dir.iterdir()) == shipped
    service = (unit_dir / "rq@.service").read_text()
    assert f"ExecStart={out}/bin/rqsys queue %i" in service
    assert "ExecReload=/nix/store/00000000000000000000000000000000-coreutils/bin/kill" in service
    for unit in unit_dir.iterdir():
        assert "/usr/bin/" not in unit.read_text() and "=/bin/" not in unit.read_text(), unit
    assert (out / "lib" / "tmpfiles.d" / "rqsys.conf").is_file()
    assert (out / "lib" / "sysusers.d" / "rqsys.conf").is_file()


# ------------------------------------------------------------------ flake
@pytest.fixture(scope="module")
def flake() -> dict[str, Any]:
    done = nix_instantiate("--eval", "--strict", "--json",
                           str(REPO / "nix" / "tests" / "eval-flake.nix"))
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_flake_exposes_package_module_shell_and_checks(flake: dict[str, Any]) -> None:
    assert flake["systems"] == ["aarch64-linux", "x86_64-linux"]
    assert flake["packages"] == {"default": str(REPO / "nix" / "package.nix"),
                                 "rqsys": str(REPO / "nix" / "package.nix")}
    assert flake["moduleImports"] == [str(REPO / "nix" / "module.nix")]
    assert flake["modulePackage"].endswith("-rqsys")  # the module defaults to the flake's
    assert flake["devShellInputs"] == [flake["modulePackage"]]
    assert {"scdoc", "mandoc", "pytest"} <= set(flake["devShellPackages"])
    assert flake["checks"] == ["package", "vm"]


def test_vm_test_configures_a_valid_queue(flake: dict[str, Any]) -> None:
    vm = flake["vmConfig"]
    assert vm["failedAssertions"] == []
    assert vm["systemd"]["sockets"]["rq@hello"]["wantedBy"] == ["sockets.target"]
    run = entry_files(vm["services"]["rq"]["generated"]["scandir"]["hello"])["run"]
    assert run["text"] == flake["vmScript"]


def test_vm_test_script_compiles_and_waits_for_done(flake: dict[str, Any]) -> None:
    script = flake["vmTestScript"]
    compile(script, "vm-test-script", "exec")
    assert "curl" in script and "/q/hello/new_message" in script
    said = re.search(r'echo "done (said hello to) \$RQ_PARAM1" >&3', flake["vmScript"])
    assert said and f"^ok done - {said.group(1)} vm" in script
