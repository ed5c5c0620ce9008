"""``rqsys install-system``: link a pip install's commands and man pages into a prefix.

A ``pip install`` into a venv (``/opt/rqsys``) leaves ``rq``, ``rqsys`` and the
man pages inside the venv, where neither PATH nor ``man`` look.  This links
them into ``<prefix>/bin`` and ``<prefix>/share/man/man<N>`` (``/usr/local``
by default), so the commands run by name and the units' ``Documentation=man:``
resolve.  ``--undo`` removes exactly those links.  A path that is anything but
our own link is never touched: the install refuses, the undo leaves it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rqsys.errors import ConfigError

DEFAULT_PREFIX = Path("/usr/local")
COMMANDS = ("rq", "rqsys")
MAN_SECTIONS = ("man1", "man5", "man7", "man8")


def install_root() -> Path:
    """The install (venv or --prefix) this rqsys runs from."""
    return Path(sys.prefix)


def links(prefix: Path, root: Path) -> list[tuple[Path, Path]]:
    """(link, target) for every command and built man page of the install."""
    pairs = [(prefix / "bin" / name, root / "bin" / name) for name in COMMANDS]
    if not all(target.is_file() for _link, target in pairs):
        raise ConfigError(f"{root}/bin holds no rq and rqsys: not an installed rqsys")
    for section in MAN_SECTIONS:
        pages = sorted((root / "share" / "man" / section).glob("*"))
        pairs += [(prefix / "share" / "man" / section / page.name, page) for page in pages]
    return pairs


def _is_link_to(link: Path, target: Path) -> bool:
    return link.is_symlink() and os.readlink(link) == str(target)


def _refusal(link: Path, target: Path) -> str | None:
    """Why ``link`` cannot be made, or None (free, or already ours)."""
    if not os.path.lexists(link) or _is_link_to(link, target):
        return None
    return f"{link} exists and is not a link to {target}; remove it or choose another --prefix"


def install(prefix: Path, root: Path) -> list[Path]:
    """Make every link (nothing at all when one path is taken); returns those made."""
    pairs = links(prefix, root)
    for link, target in pairs:
        if reason := _refusal(link, target):
            raise ConfigError(reason)
    made = []
    for link, target in pairs:
        if not _is_link_to(link, target):
            _link(link, target)
            made.append(link)
    return made


def _link(link: Path, target: Path) -> None:
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
    except OSError as exc:  # not root for /usr/local, a read-only prefix, ...
        raise ConfigError(f"cannot link {link}: {exc.strerror}") from exc


def undo(prefix: Path, root: Path) -> list[Path]:
    """Remove the links that point into this install; returns those removed."""
    removed = []
    for link, target in links(prefix, root):
        if _is_link_to(link, target):
            try:
                link.unlink()
            except OSError as exc:
                raise ConfigError(f"cannot remove {link}: {exc.strerror}") from exc
            removed.append(link)
    return removed


def main(prefix: Path | None, remove: bool) -> int:
    """Install (or undo) under ``prefix``, printing each link made or removed."""
    prefix = (prefix or DEFAULT_PREFIX).absolute()
    root = install_root()
    done = undo(prefix, root) if remove else install(prefix, root)
    for link in done:
        print(f"{'removed' if remove else 'linked'} {link}")
    if not remove and not (root / "share" / "man" / "man1").is_dir():
        print(f"rqsys: no man pages under {root}/share/man (built without scdoc)",
              file=sys.stderr)
    return 0
