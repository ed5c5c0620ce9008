"""A create is refused as soon as RQ's admin file says DOWN, although the
daemon no longer stats the files at each create while inotify watches them
(rqsys.daemon.adminfiles): the watch's news are taken before the requests
of the same wait, and a watch that ends falls back to reading the files."""

from __future__ import annotations

import shutil

import pytest
from daemon_util import send

from rqsys.errors import QueueDown


def test_a_create_right_after_a_touch_is_refused(make_queue, daemon, layout):
    make_queue("q", 'echo "done ok" >&3')
    proc = daemon("q")
    down = layout.config_file.parent / "q.down"
    for _ in range(20):
        # Given the queue UP (a create taken), When .down is touched,
        # Then the very next create is refused, with no status request between
        send(proc)
        down.touch()
        with pytest.raises(QueueDown, match="DOWN"):
            send(proc)
        down.unlink()


def test_without_its_directory_the_files_are_read_at_each_create(make_queue, daemon, layout):
    make_queue("q", 'echo "done ok" >&3')
    proc = daemon("q")
    config = layout.config_file.parent
    send(proc)
    # Given the watched directory replaced by a copy (the watch went with the old one)
    shutil.copytree(config, config.with_name("config.new"))
    shutil.rmtree(config)
    config.with_name("config.new").rename(config)
    send(proc)
    # When .down appears, Then a create is refused all the same
    (config / "q.down").touch()
    with pytest.raises(QueueDown, match="DOWN"):
        send(proc)
