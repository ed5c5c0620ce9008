"""Build steps pyproject.toml cannot express: the cffi module, man pages, units.

- ``cffi_modules`` compiles the spawn helper (rqsys/_native); ``build_ext``
  also links ``rqsys/_native/rqrelay``, the relay queue's small C script, and
  ``rqsys/_native/rqspawnd``, a queue daemon's fork server.
- The man pages in ``man/*.scd`` are built with scdoc(1) when the package is
  installed and land in ``share/man/manN/``; without scdoc they are left out
  with a warning (set RQSYS_REQUIRE_MAN=1 to make that an error).
- The systemd units in ``units/`` are installed under ``share/rqsys/units/``
  (``rqsys install-units`` copies them into place).
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.install_data import install_data
except ImportError:  # setuptools < 69 ships it only through distutils
    from distutils.command.install_data import install_data

HERE = Path(__file__).resolve().parent
MAN_SOURCES = sorted((HERE / "man").glob("*.scd"))
MAN_BUILD = Path("build") / "man"


def man_target(source: Path) -> Path:
    """``man/rq.1.scd`` -> ``build/man/rq.1``."""
    return MAN_BUILD / source.name[: -len(".scd")]


def man_section(source: Path) -> str:
    return source.name[: -len(".scd")].rsplit(".", 1)[1]


def build_man_pages() -> bool:
    """Run scdoc on every page; False (after a warning) when scdoc is missing."""
    scdoc = shutil.which("scdoc")
    if scdoc is None:
        if os.environ.get("RQSYS_REQUIRE_MAN") == "1":
            sys.exit("rqsys: scdoc(1) is needed to build the man pages")
        print("rqsys: warning: scdoc not found, man pages not installed", file=sys.stderr)
        return False
    (HERE / MAN_BUILD).mkdir(parents=True, exist_ok=True)
    for source in MAN_SOURCES:
        with source.open("rb") as src, (HERE / man_target(source)).open("wb") as out:
            subprocess.run([scdoc], stdin=src, stdout=out, check=True)
    return True


class InstallDataWithMan(install_data):
    """install_data that builds the man pages first (drops them without scdoc)."""

    def run(self) -> None:
        if not build_man_pages():
            self.data_files = [(d, f) for d, f in self.data_files if "/man/" not in d + "/"]
        super().run()


class BuildExtWithShim(build_ext):
    """build_ext that also links the small executables beside the spawn helper:
    rqrelay (the relay queue's script) and rqspawnd (a daemon's fork server)."""

    def run(self) -> None:
        super().run()
        here = Path(self.get_ext_fullpath("rqsys._native._rqspawn")).parent
        here.mkdir(parents=True, exist_ok=True)
        for name in ("rqrelay", "rqspawnd"):
            objects = self.compiler.compile([f"rqsys/_native/{name}.c"],
                                            output_dir=self.build_temp,
                                            extra_postargs=["-O2", "-Wall"])
            # LDFLAGS as the shared object gets them (Debian's hardening: relro, now)
            self.compiler.link_executable(
                objects, name, output_dir=str(here),
                extra_postargs=shlex.split(os.environ.get("LDFLAGS", "")))


def data_files() -> list[tuple[str, list[str]]]:
    files: dict[str, list[str]] = {}
    for source in MAN_SOURCES:
        files.setdefault(f"share/man/man{man_section(source)}", []).append(
            str(man_target(source)))
    for unit in sorted(p for p in (HERE / "units").rglob("*") if p.is_file()):
        where = unit.parent.relative_to(HERE / "units")
        target = "share/rqsys/units" + ("" if where == Path(".") else f"/{where}")
        files.setdefault(target, []).append(str(unit.relative_to(HERE)))
    return sorted(files.items())


setup(
    # Here and not in pyproject.toml: see the comment on "dynamic" there.
    license="MIT",
    cffi_modules=["rqsys/_native/build_spawn.py:ffibuilder"],
    data_files=data_files(),
    cmdclass={"install_data": InstallDataWithMan, "build_ext": BuildExtWithShim},
)
