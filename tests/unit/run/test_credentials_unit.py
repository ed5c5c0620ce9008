"""A queue's credentials in process (rqsys.run.credentials): the schema's rules,
the drop-in rq-scan writes beside the limits one, each run's private copies in
embedded mode (modes, removal, a missing file, a crashed daemon's leftovers),
the refusal of encrypted ones without systemd, and the environment a script
gets.  The real daemon: tests/integration/run/test_credentials_embedded.py;
the real systemd: tests/system/test_credentials_systemd.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rqsys import config
from rqsys.daemon.context import QueueContext
from rqsys.errors import ConfigError, RQError
from rqsys.observe.events import EventLog
from rqsys.run import credentials, resources
from rqsys.run.credentials import CredentialError, Credentials
from rqsys.run.environment import RunEnvironment
from rqsys.scan import enabler

SECRET = b"s3cr3t-\x00-bytes\n"
LOG = EventLog("q", journal=False)


@pytest.fixture(autouse=True)
def private_run(tmp_path, monkeypatch):
    """/run/rqsys/credentials of this test's own (the host's is left alone)."""
    monkeypatch.setattr(credentials, "SYSTEM_BASE", tmp_path / "run" / "rqsys" / "credentials")


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "secrets" / "db"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def embedded(root: Path, creds: dict, **env: str) -> Credentials:
    return Credentials(root, "q", LOG, {"credentials": creds}, environ=env)


# ------------------------------------------------------------------ the schema
@pytest.mark.parametrize("creds", [
    {"db": "/etc/rq/db"}, {"A.b-c_9": {"encrypted": "/etc/rq/t.cred"}},
    {"x": "/a/.hidden/b%c:d"}, {"n" * 255: "/x"}, {}])
def test_the_schema_takes_systemds_names_and_absolute_paths(creds):
    assert config.queue_config("q", "/bin/true", {"credentials": creds})["credentials"] == creds


@pytest.mark.parametrize("creds", [
    {".": "/x"}, {"..": "/x"}, {"a/b": "/x"}, {"a b": "/x"}, {"n" * 256: "/x"}, {"": "/x"},
    {"a": "relative"}, {"a": "/"}, {"a": "/x/../y"}, {"a": "/x/./y"}, {"a": "/x//y"},
    {"a": "/x/"}, {"a": "/x "}, {"a": "/x\ny"}, {"a": "/x\\y"}, {"a": 1},
    {"a": {"encrypted": "rel"}}, {"a": {"encrypted": "/x", "more": 1}}, {"a": {}}])
def test_the_schema_refuses_what_systemd_would_not_take(creds):
    with pytest.raises(ConfigError, match="credentials"):
        config.queue_config("q", "/bin/true", {"credentials": creds})


# ------------------------------------------------------------------ the drop-in
def test_the_drop_in_loads_each_credential_plain_or_encrypted():
    text = credentials.drop_in({"credentials": {"tok": {"encrypted": "/e/t.cred"},
                                                "db": "/s/100%/db"}})
    assert text.endswith("[Service]\nLoadCredential=db:/s/100%%/db\n"
                         "LoadCredentialEncrypted=tok:/e/t.cred\n")
    assert credentials.drop_in({}) == credentials.drop_in({"credentials": {}}) == ""


def test_rq_scan_keeps_the_credentials_drop_in_beside_the_limits_one(layout, tmp_path, capsys):
    # Given a queue with limits and a credential, under the systemd enabler
    units = tmp_path / "units"
    sd = enabler.SystemdEnabler(LOG, "systemctl", layout, units)
    dropins = units / "rq@a.service.d"
    creds_file = dropins / credentials.DROP_IN_NAME

    def install(**cfg):
        layout.create_queue_dir("a", config.queue_config("a", "/bin/true", cfg))
        return sd._limits_changed(["a"])

    before = sd._read_at_start("a")
    # When it is installed, Then both drop-ins are written (systemd must reload)
    assert install(limits={"tasks_max": 9}, credentials={"db": "/s/db"})
    assert "LoadCredential=db:/s/db" in creds_file.read_text()
    assert (dropins / resources.DROP_IN_NAME).exists()
    assert sd._read_at_start("a") != before  # so its reload is a restart
    # and, the file being missing, its log says systemd will not start the daemon
    assert ("queue a: credential db: /s/db cannot be read; systemd will not start"
            in capsys.readouterr().err)
    # the same config again changes nothing
    assert not install(limits={"tasks_max": 9}, credentials={"db": "/s/db"})
    # a changed credential rewrites it; a removed one removes only its drop-in
    assert install(limits={"tasks_max": 9}, credentials={"db": {"encrypted": "/s/db.cred"}})
    assert "LoadCredentialEncrypted=db:/s/db.cred" in creds_file.read_text()
    assert install(limits={"tasks_max": 9})
    assert not creds_file.exists() and (dropins / resources.DROP_IN_NAME).exists()
    # and a queue taken out of service leaves none, nor their directory
    install(credentials={"db": "/s/db"})
    assert sd._limits_changed(["a"], removed=True) and not dropins.exists()


# ------------------------------------------------------------------ embedded: each run's copies
def test_a_run_gets_private_copies_removed_at_its_end(tmp_path, secret):
    creds = embedded(tmp_path / "root", {"db": str(secret), "db2": str(secret)})
    assert creds.per_run and not creds.refusal
    env = creds.open_run("m1")
    into = Path(env[credentials.ENV])
    assert into.is_relative_to(credentials.SYSTEM_BASE)
    assert stat.S_IMODE(into.stat().st_mode) == 0o700
    assert sorted(os.listdir(into)) == ["db", "db2"]
    for name in ("db", "db2"):
        assert stat.S_IMODE((into / name).stat().st_mode) == 0o400
        assert (into / name).read_bytes() == SECRET
    other = Path(creds.open_run("m2")[credentials.ENV])  # each run its own
    assert other != into
    creds.close_run("m1")
    assert not into.exists() and other.exists()
    creds.close_run("m2")
    assert not other.parent.exists()  # the queue's directory too, once empty
    creds.close_run("m2")  # twice: nothing to do


def test_roots_sharing_run_are_kept_apart(tmp_path):
    one = credentials.places(tmp_path / "a" / "rq", "q", {})
    two = credentials.places(tmp_path / "b" / "rq", "q", {})
    assert one[0] != two[0] and one[0].parent.parent == two[0].parent.parent
    assert one[-1] == tmp_path / "a" / "rq" / "credentials" / "q"
    assert len(credentials.places(tmp_path, "q", {"XDG_RUNTIME_DIR": "/run/user/7"})) == 3


def test_a_place_that_cannot_be_used_gives_way_to_the_next(tmp_path, secret):
    creds = embedded(tmp_path / "root", {"db": str(secret)})
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    creds.places = [blocker / "q", tmp_path / "root" / "credentials" / "q"]
    into = Path(creds.open_run("m1")[credentials.ENV])
    assert into.parent == tmp_path / "root" / "credentials" / "q"
    creds.places = [blocker / "q"]
    with pytest.raises(CredentialError, match="no private directory"):
        creds.open_run("m2")


@pytest.mark.parametrize("make, why", [
    (lambda p: None, "cannot read .*: No such file or directory"),
    (lambda p: p.mkdir(), "is not a regular file"),
    (lambda p: os.mkfifo(p), "is not a regular file"),
    (lambda p: p.write_bytes(b"x" * (credentials.SIZE_MAX + 1)), "larger than"),
])
def test_a_credential_that_cannot_be_copied_is_named_not_shown(tmp_path, secret, make, why):
    bad = tmp_path / "secrets" / "bad"
    make(bad)
    creds = embedded(tmp_path / "root", {"db": str(secret), "zz": str(bad)})
    with pytest.raises(CredentialError, match=f"^credential zz: .*{why}") as err:
        creds.open_run("m1")
    assert isinstance(err.value, RQError) and str(bad) in str(err.value)
    assert SECRET.decode(errors="replace").strip() not in str(err.value)
    assert not creds.runs and not any(p.exists() for p in creds.places)  # db's copy gone too


def test_a_copy_that_cannot_be_written_ends_the_run_not_the_daemon(tmp_path, secret,
                                                                   monkeypatch):
    def full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(credentials, "_send", full)
    creds = embedded(tmp_path / "root", {"db": str(secret)})
    with pytest.raises(CredentialError, match="cannot copy into .*: No space left on device"):
        creds.open_run("m1")
    assert not creds.runs and not any(p.exists() for p in creds.places)


def test_a_crashed_daemons_run_directories_are_removed_at_start(tmp_path, secret, capsys):
    root = tmp_path / "root"
    first = embedded(root, {"db": str(secret)})
    into = Path(first.open_run("m1")[credentials.ENV])
    os.chmod(into, 0o500)  # its script made it read-only, then the daemon died
    assert into.exists()
    embedded(root, {"db": str(secret)})  # the next daemon
    assert not into.exists()
    assert "credentials: removed 1 run directories a daemon left" in capsys.readouterr().err


def test_encrypted_ones_are_refused_without_systemd_once(tmp_path, secret, capsys):
    cfg = {"credentials": {"db": str(secret), "tok": {"encrypted": "/e/tok.cred"}}}
    creds = Credentials(tmp_path / "root", "q", LOG, cfg, environ={})
    assert "credentials tok are encrypted, which only systemd decrypts" in creds.refusal
    creds.configure(cfg)  # a reload of the same: not said again
    assert capsys.readouterr().err.count("only systemd decrypts") == 1
    creds.configure({"credentials": {"db": str(secret)}})
    assert not creds.refusal and "runs go on" in capsys.readouterr().err


def test_under_the_supervisor_its_own_directory_is_not_the_queues(tmp_path, secret):
    creds = embedded(tmp_path / "root", {"tok": {"encrypted": "/e/t"}},
                     CREDENTIALS_DIRECTORY="/run/credentials/rqsys.service",
                     RQ_SUPERVISOR_PID="1")
    assert creds.systemd_dir is None and creds.refusal
    env = {credentials.ENV: "/run/credentials/rqsys.service"}
    creds.place_in(env)
    assert env == {}


# ------------------------------------------------------------------ under systemd
def test_under_systemd_a_run_checks_systemds_directory(tmp_path):
    loaded = tmp_path / "run-credentials"
    loaded.mkdir()
    (loaded / "db").write_bytes(SECRET)
    creds = embedded(tmp_path / "root", {"db": "/s/db", "tok": {"encrypted": "/s/t.cred"}},
                     CREDENTIALS_DIRECTORY=str(loaded))
    assert not creds.per_run and not creds.refusal
    with pytest.raises(CredentialError, match=r"^credential tok: not loaded by systemd"):
        creds.open_run("m1")
    (loaded / "tok").write_bytes(SECRET)
    assert creds.open_run("m1") == {} and not creds.runs
    env = {credentials.ENV: "/set/by/env_vars"}
    creds.place_in(env)
    assert env == {credentials.ENV: str(loaded)}


# ------------------------------------------------------------------ the script's environment
def queue_env(layout, creds_cfg: dict, environ: dict) -> RunEnvironment:
    cfg = config.queue_config("q", "/bin/true", {"credentials": creds_cfg})
    ctx = QueueContext(layout, "q", config.load_system_config(layout), cfg)
    return RunEnvironment(ctx, Credentials(layout.root, "q", LOG, cfg, environ=environ))


def test_the_environment_holds_the_directory_never_the_secret(layout, secret, monkeypatch):
    monkeypatch.setenv(credentials.ENV, "/run/credentials/rqsys.service")  # a supervisor's
    env = queue_env(layout, {"db": str(secret)}, {})
    run = env.of_run("m1", {"count": 0}, "/bin/true", "/job")
    assert credentials.ENV not in env.shared()
    assert Path(run[credentials.ENV]).is_dir()
    env.strings().array(run)  # a slot for it among the run's own variables
    assert not [v for v in {**env.shared(), **run}.values() if "s3cr3t" in v]
    env.credentials.close_run("m1")  # type: ignore[union-attr]


def test_without_credentials_nothing_changes(layout, monkeypatch):
    monkeypatch.delenv(credentials.ENV, raising=False)
    env = queue_env(layout, {}, {})
    assert credentials.ENV not in env.of_run("m1", {"count": 0}, "/bin/true", "/job")
    assert not env.credentials.per_run  # type: ignore[union-attr]
