"""The pure parts of files triggers: names taken, the message and its key,
the listing, "being written" from a real read lease, ``then`` on real files,
and the state file kept across a restart."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rqsys.store import Layout
from rqsys.triggers import files, filework
from rqsys.triggers.filework import FileSpec, Result, Work


def spec_of(path: Path, glob: str = "*.csv", recursive: bool = False,
            then: object = "keep", **msg: str) -> FileSpec:
    return FileSpec("drop", str(path), glob, recursive, {"dest": "ingest", **msg}, then)


def test_the_glob_takes_the_files_name_and_dot_files_only_when_it_starts_with_a_dot(
        tmp_path: Path) -> None:
    fs = spec_of(tmp_path)
    assert filework.matches(fs, "a.csv") and not filework.matches(fs, "a.csv.part")
    assert not filework.matches(fs, ".a.csv")  # a writer's temp name beside it
    assert filework.matches(spec_of(tmp_path, glob=".*"), ".a.csv")
    assert filework.matches(spec_of(tmp_path, glob="*"), "x")


def test_the_message_names_the_file_unless_msg_does_and_carries_its_key(tmp_path: Path) -> None:
    st = os.stat(tmp_path)
    key = filework.unique_key("drop", st)
    assert key == (f"file:drop:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    made = filework.message(spec_of(tmp_path, param2="p"), "sub/a.csv", key)
    assert made == {"param1": "sub/a.csv", "dest": "ingest", "param2": "p",
                    "unique_key": key, "unique_for": filework.UNIQUE_FOR}
    assert filework.message(spec_of(tmp_path, param1="fixed"), "a.csv", key)["param1"] == "fixed"


@pytest.mark.parametrize(("name", "attached"), [
    ("a.csv", "a.csv"), ("report 2024 (1).csv", "report_2024__1_.csv"), ("-x", "_-x"),
    ("été.txt", "_t_.txt")])
def test_an_attachment_name_keeps_what_an_attachment_may_have(name: str, attached: str) -> None:
    assert filework.attachment_name(name) == attached


def test_the_listing_takes_matching_files_and_below_only_when_recursive(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    for rel in ("a.csv", "b.txt", ".c.csv", "sub/d.csv", "sub/deeper/e.csv"):
        (tmp_path / rel).write_text("x")
    flat = filework.listing(spec_of(tmp_path), str(tmp_path))
    deep = filework.listing(spec_of(tmp_path, recursive=True), str(tmp_path))
    assert sorted(os.path.relpath(p, tmp_path) for p in flat) == ["a.csv"]
    assert sorted(os.path.relpath(p, tmp_path) for p in deep) == [
        "a.csv", "sub/d.csv", "sub/deeper/e.csv"]
    with pytest.raises(FileNotFoundError):
        filework.listing(spec_of(tmp_path), str(tmp_path / "gone"))


def test_a_file_open_for_writing_is_being_written_and_a_closed_one_is_not(
        tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    writer = path.open("w")
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        old = time.time() + 3600  # no mtime excuse: the lease decides (we own the file)
        assert filework.being_written(fd, st, old)
        writer.close()
        assert not filework.being_written(fd, st, old)
    finally:
        os.close(fd)
        writer.close()


def test_move_keeps_a_name_already_there_and_lands_durably(tmp_path: Path) -> None:
    into = tmp_path / "done"
    into.mkdir()
    (into / "a.csv").write_text("old")
    src = tmp_path / "a.csv"
    src.write_text("new")
    dest = filework.move(src, into)
    assert dest == into / "a.csv.1" and dest.read_text() == "new" and not src.exists()
    assert (into / "a.csv").read_text() == "old"


def work_with(tmp_path: Path) -> Work:
    layout = Layout(tmp_path / "root", tmp_path / "root" / "sock")
    layout.make_dirs()
    return Work(layout, "drop")


@pytest.mark.parametrize("then", ["keep", "delete", {"move": "MOVE"}])
def test_then_is_done_to_the_version_the_message_took_only(tmp_path: Path, then: object) -> None:
    inbox, moved = tmp_path / "in", tmp_path / "moved"
    inbox.mkdir()
    moved.mkdir()
    if isinstance(then, dict):
        then = {"move": str(moved)}
    fs, work, out = spec_of(inbox, then=then), work_with(tmp_path), Result()
    path = inbox / "a.csv"
    path.write_text("v1")
    key = filework.unique_key("drop", os.stat(path))
    # a newer version at the same path is not the message's: left alone
    path.write_text("version 2")
    assert work._then(fs, key, str(path), out) is False and path.read_text() == "version 2"
    key = filework.unique_key("drop", os.stat(path))
    stays = work._then(fs, key, str(path), out)
    assert stays is (then == "keep")
    assert path.exists() is (then == "keep")
    assert (moved / "a.csv").exists() is isinstance(then, dict)


def test_an_ended_message_leaves_pending_and_the_state_file_survives_a_restart(
        tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    path = inbox / "a.csv"
    path.write_text("x")
    fs, work = spec_of(inbox), work_with(tmp_path)
    work._load()
    key = filework.unique_key("drop", os.stat(path))
    entry = {"path": str(path), "msg_id": "20260101.0000.00.000.1", "queue": "ingest"}
    assert work.pending is not None
    work.pending.update({key: entry, "other": {**entry, "path": str(inbox / "b.csv")}})
    work.dirty = True
    work._ended(fs, key, entry, "que", Result())
    assert key in work.pending  # not ended yet
    work._ended(fs, key, entry, "err", Result())
    assert key in work.pending  # a retry may make it done
    work._ended(fs, key, entry, "done", Result())
    assert key not in work.pending and work.kept == {key: str(path)}  # then: keep
    work._save()
    again = Work(work.layout, "drop")
    again._load()
    assert again.kept == {key: str(path)} and list(again.pending or {}) == ["other"]
    # a full listing forgets the kept files that are no longer there as they were
    path.write_text("changed")
    again._prune_kept([str(path)])
    assert again.kept == {}
    saved = json.loads(work.path.read_text())
    assert set(saved) == {"pending", "kept"}


def test_a_trigger_wakes_at_once_with_work_and_not_while_its_job_runs(tmp_path: Path) -> None:
    watched = files.Watched(spec_of(tmp_path), work_with(tmp_path))
    assert watched.wake() is None and not watched.due(time.monotonic())
    watched.candidates.add(str(tmp_path / "a.csv"))
    assert watched.wake() == 0.0 and watched.due(time.monotonic())
    watched.busy = True
    assert watched.wake() is None and not watched.due(time.monotonic())
    watched.busy, watched.candidates = False, set()
    watched.later[str(tmp_path / "b.csv")] = time.monotonic() + 5
    assert not watched.due(time.monotonic()) and watched.due(time.monotonic() + 6)
