"""Finding the state root and its sockets (``Layout.from_root``, ``--root``):
``--root``, then $RQ_ROOT, then /var/lib/rq; sockets in $RQ_SOCKET_DIR, else
/run/rq for the system root, else ``<root>/sock``; and what ``rq`` says of a
root that is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from rqsys.cli.common import RET_FAIL
from rqsys.cli.rq import rq_main, rq_parser
from rqsys.store import Layout


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("RQ_ROOT", raising=False)
    monkeypatch.delenv("RQ_SOCKET_DIR", raising=False)


def where(layout: Layout) -> tuple[str, str]:
    return str(layout.root), str(layout.socket_dir)


def test_without_root_or_environment_it_is_the_system_root():
    assert where(Layout.from_root()) == ("/var/lib/rq", "/run/rq")
    assert where(Layout.from_root("/var/lib/rq/")) == ("/var/lib/rq", "/run/rq")


def test_rq_root_is_taken_and_its_sockets_are_under_it(monkeypatch):
    monkeypatch.setenv("RQ_ROOT", "/srv/rq")
    assert where(Layout.from_root()) == ("/srv/rq", "/srv/rq/sock")
    assert where(Layout.from_root(None)) == ("/srv/rq", "/srv/rq/sock")


def test_a_given_root_wins_over_rq_root(monkeypatch):
    monkeypatch.setenv("RQ_ROOT", "/srv/rq")
    assert where(Layout.from_root("/tmp/mine")) == ("/tmp/mine", "/tmp/mine/sock")
    assert where(Layout.from_root("/var/lib/rq")) == ("/var/lib/rq", "/run/rq")


def test_rq_socket_dir_wins_for_any_root(monkeypatch):
    monkeypatch.setenv("RQ_SOCKET_DIR", "/run/elsewhere")
    assert where(Layout.from_root()) == ("/var/lib/rq", "/run/elsewhere")
    assert where(Layout.from_root("/srv/rq")) == ("/srv/rq", "/run/elsewhere")
    monkeypatch.setenv("RQ_SOCKET_DIR", "")  # empty: not set
    assert where(Layout.from_root("/srv/rq")) == ("/srv/rq", "/srv/rq/sock")


def test_a_relative_root_is_made_absolute_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert where(Layout.from_root("state")) == (f"{tmp_path}/state", f"{tmp_path}/state/sock")


def test_a_queues_socket_is_its_name_in_the_socket_directory():
    assert Layout.from_root("/srv/rq").socket_path("etl-1") == Path("/srv/rq/sock/etl-1.sock")


@pytest.mark.parametrize(("argv", "root"), [
    (["queues"], "/from/env"), (["--root", "/a", "queues"], "/a"),
    (["queues", "--root", "/b"], "/b"), (["--root", "/a", "queues", "--root", "/b"], "/b"),
])
def test_rqs_root_option_before_or_after_the_verb_and_its_default(monkeypatch, argv, root):
    monkeypatch.setenv("RQ_ROOT", "/from/env")  # read when the parser is made
    assert rq_parser().parse_args(argv).root == root


def make_root(path: Path, *queues: str) -> None:
    layout = Layout.from_root(path)
    layout.make_dirs()
    for name in queues:
        layout.create_queue_dir(name, {"name": name})


def test_rq_reads_the_root_rq_root_names_or_the_one_given(tmp_path, monkeypatch, capsys):
    make_root(tmp_path / "a", "etl-1")
    make_root(tmp_path / "b", "billing")
    monkeypatch.setenv("RQ_ROOT", str(tmp_path / "a"))
    assert rq_main(["queues"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        "ok 1", "etl-1\tUP\tprep=0 que=0 run=0 done=0 err=0 relayed=0"]
    assert rq_main(["--root", str(tmp_path / "b"), "queues"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("billing\t")


def test_a_root_that_is_not_there_is_a_failure_saying_how_to_name_one(tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.setenv("RQ_ROOT", str(tmp_path / "nope"))
    assert rq_main(["queues"]) == RET_FAIL == 1
    why = (f"no rqsys state directory at {tmp_path}/nope: pass --root DIR or set RQ_ROOT to "
           "the one rqsys serves (make run prints it)")
    assert capsys.readouterr() == (f"fail {why}\n", f"rq: {why}\n")
    assert not (tmp_path / "nope").exists()  # a client verb makes no root
