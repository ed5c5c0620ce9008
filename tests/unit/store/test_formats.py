"""The state root's on-disk format (rqsys.store.formats): a new root stamped,
an older one migrated step by step (each step run again after a cut), a
newer or unreadable one refused with one line naming both versions."""

from __future__ import annotations

import json
import threading

import pytest

from rqsys import __version__
from rqsys.store import formats
from rqsys.store.formats import FormatError


def test_a_new_root_is_stamped_with_this_format(tmp_path):
    root = tmp_path / "root"
    assert formats.ensure(root) == formats.FORMAT
    data = json.loads((root / formats.FILE).read_text())
    assert data == {"format": formats.FORMAT, "by": f"rqsys {__version__}"}


def test_a_root_with_queues_and_no_version_is_format_0_and_migrated(tmp_path):
    (tmp_path / "queue" / "q" / "que").mkdir(parents=True)
    said = []
    assert formats.ensure(tmp_path, said.append) == 0
    assert formats.read(tmp_path) == formats.FORMAT
    assert said == [f"state root {tmp_path}: on-disk format 0, migrating to {formats.FORMAT}"]
    said.clear()
    assert formats.ensure(tmp_path, said.append) == formats.FORMAT and said == []


def test_a_step_cut_off_runs_again_and_the_version_follows_it(tmp_path, monkeypatch):
    (tmp_path / "queue" / "q").mkdir(parents=True)
    runs = []

    def cut(root):
        runs.append(root)
        raise OSError(5, "Input/output error")  # the power went in the middle of the step
    monkeypatch.setitem(formats.STEPS, 0, cut)
    with pytest.raises(OSError):
        formats.ensure(tmp_path)
    assert formats.read(tmp_path) is None  # still format 0: nothing said it was done
    monkeypatch.setitem(formats.STEPS, 0, runs.append)
    (tmp_path / f".{formats.FILE}.1.tmp").write_text('{"format": 1')  # a cut in its write
    assert formats.ensure(tmp_path) == 0
    assert runs == [tmp_path, tmp_path] and formats.read(tmp_path) == formats.FORMAT
    assert sorted(p.name for p in tmp_path.iterdir()) == [formats.LOCK, formats.FILE, "queue"]


def test_a_newer_format_is_refused_naming_both(tmp_path):
    (tmp_path / formats.FILE).write_text('{"format": 99, "by": "rqsys 9.0"}\n')
    with pytest.raises(FormatError) as got:
        formats.ensure(tmp_path)
    assert str(got.value) == (
        f"the state root {tmp_path} is in on-disk format 99, newer than this rqsys "
        f"({__version__}) knows (format {formats.FORMAT}): run the rqsys that wrote it, "
        "or a newer one")
    assert json.loads((tmp_path / formats.FILE).read_text())["format"] == 99  # untouched


@pytest.mark.parametrize("text, why", [
    ("{not json", "cannot be read"), ('{"format": "1"}', "no format version in it"),
    ('{"format": -1}', "no format version in it"), ("[1]", "no format version in it"),
    ('{"format": true}', "no format version in it")])
def test_an_unreadable_version_is_refused(tmp_path, text, why):
    (tmp_path / formats.FILE).write_text(text)
    with pytest.raises(FormatError, match=why) as got:
        formats.ensure(tmp_path)
    assert str(got.value).startswith(f"{tmp_path / formats.FILE}: ")


def test_two_programs_starting_together_migrate_once(tmp_path, monkeypatch):
    (tmp_path / "queue" / "q").mkdir(parents=True)
    runs, gate = [], threading.Event()

    def slow(root):
        runs.append(root)
        gate.wait(5)  # the other one waits on the lock meanwhile
    monkeypatch.setitem(formats.STEPS, 0, slow)
    found = []
    threads = [threading.Thread(target=lambda: found.append(formats.ensure(tmp_path)))
               for _ in range(2)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert len(runs) == 1 and sorted(found) == [0, formats.FORMAT]
