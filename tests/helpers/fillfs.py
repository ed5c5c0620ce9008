"""A real file system filled to its last block or its last inode (the full-disk tests)."""

from __future__ import annotations

import os
from pathlib import Path

from rqsys.store import room


def fill_blocks(filler: Path) -> None:
    """Every block taken: one big file, then 4 KiB at a time until ENOSPC."""
    filler.mkdir()
    free = room.read(str(filler)).free_bytes
    with open(filler / "big", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, free - (2 << 20)))
    fill_blocks_again(filler)
    fill_inodes_in(filler, "small")  # and the bytes of what little is left in blocks


def fill_blocks_again(filler: Path) -> None:
    """What was freed taken again, by the filler's last file."""
    with open(filler / "tail", "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def fill_inodes(filler: Path) -> None:
    """Every inode taken: empty files until ENOSPC."""
    filler.mkdir()
    fill_inodes_in(filler, "f")


def fill_inodes_in(filler: Path, prefix: str) -> None:
    n = 0
    try:
        while True:
            os.close(os.open(filler / f"{prefix}{n}", os.O_CREAT | os.O_WRONLY, 0o644))
            n += 1
    except OSError:
        pass
