"""What the cuts of a file system found: the tally, and the report printed from it."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tally:
    """What the cuts of one file system found."""

    fs: str
    cuts: int = 0
    acked: int = 0
    lost: dict[str, dict[str, Any]] = field(default_factory=dict)
    corrupted: dict[str, dict[str, Any]] = field(default_factory=dict)
    relay_duplicates: dict[str, dict[str, Any]] = field(default_factory=dict)
    fsck: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # boots rqsys did not survive
    migrate_cuts: list[str] = field(default_factory=list)  # where the guest cut (--migrate-cut)
    formats: list[dict[str, Any]] = field(default_factory=list)  # format.json, checked
    seconds: float = 0.0

    def line(self, label: str = "") -> str:
        where = f"[{label}]" if label else ""
        failed = f", {len(self.failures)} boots failed" if self.failures else ""
        fmt = (f", format finished {len(self.formats) - len(self.wrong_formats())} of "
               f"{len(self.formats)}" if self.formats else "")
        return (f"powercut{where}: {self.cuts} cuts, {self.acked} acked, "
                f"{len(self.lost)} lost, {len(self.corrupted)} corrupted{fmt}{failed}")

    def wrong_formats(self) -> list[dict[str, Any]]:
        return [f for f in self.formats if not f["ok"]]

    def clean(self) -> bool:
        return not (self.lost or self.corrupted or self.failures or self.wrong_formats())

    def add_check(self, result: dict[str, Any], fsck_text: str = "") -> None:
        for item in result["lost"]:
            key = f"{item['q']}/{item['id']}"
            if key not in self.lost:
                self.lost[key] = dict(item, boot=result["boot"],
                                      fsck=about_inode(fsck_text, item.get("where", "")))
        for item in result["corrupted"]:
            self.corrupted.setdefault(f"{item['q']}/{item['id']}", item)
        for item in result["relay_duplicates"]:
            self.relay_duplicates.setdefault(item["id"], item)
        if "format" in result:
            self.formats.append(dict(result["format"], boot=result["boot"]))


def about_inode(fsck_text: str, where: str) -> str:
    """What fsck said after the cut (checking, then repairing) about the inode
    a lost message was found at (``lost+found/#N``): which directory it was
    last in.  An inode the stale group descriptors hide from the read-only
    check shows only in the repair's words."""
    match = re.search(r"#(\d+)", where)
    if not match:
        return ""
    pattern = re.compile(rf"\binode {match.group(1)}\b")
    lines = dict.fromkeys(ln.strip() for ln in fsck_text.splitlines() if pattern.search(ln))
    return " | ".join(lines)[:300]


def fsck_findings(text: str) -> list[str]:
    """The lines of fsck's output that report a problem."""
    noise = ("Pass ", "Phase ", "exit ", "e2fsck ", "        - ", "No modify flag",
             "Checking ", "Warning: no quota", "/dev/vda: ")
    lines = [ln.strip() for ln in text.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith(noise)][:40]


def total(tallies: list[Tally]) -> Tally:
    whole = Tally("total")
    for t in tallies:
        whole.cuts += t.cuts
        whole.acked += t.acked
        whole.lost.update({f"{t.fs}:{k}": v for k, v in t.lost.items()})
        whole.corrupted.update({f"{t.fs}:{k}": v for k, v in t.corrupted.items()})
        whole.failures += t.failures
        whole.migrate_cuts += t.migrate_cuts
        whole.formats += t.formats
        whole.seconds += t.seconds
    return whole


def report(tallies: list[Tally], out: Any = sys.stdout) -> None:
    for t in tallies:
        print(f"{t.line(t.fs)} ({t.seconds:.0f}s)", file=out)
        for key, item in list(t.lost.items())[:20]:
            print(f"  lost {key}: {item['why']} (last ack: {item['last_op']}, found at "
                  f"boot {item.get('boot')}) {item.get('where', '')} {item.get('fsck', '')}",
                  file=out)
        for key, item in list(t.corrupted.items())[:20]:
            print(f"  corrupted {key}: {item['why']}", file=out)
        for key in list(t.relay_duplicates)[:5]:
            print(f"  relay duplicate {key}", file=out)
        if t.migrate_cuts:
            print(f"  cut in the migration: {', '.join(t.migrate_cuts)}", file=out)
        for f in t.wrong_formats():
            print(f"  format not finished (boot {f['boot']}): {f['why']}", file=out)
        for failure in t.failures[:3]:
            print(f"  boot failed: {failure[:1500]}", file=out)
        dirty = [f for f in t.fsck if f["code"] != 0]
        print(f"  fsck: {len(t.fsck)} runs, {len(dirty)} with findings", file=out)
        for f in dirty[:5]:
            print(f"    {f['image']} boot {f['boot']} {f['when']}: exit {f['code']}: "
                  + " | ".join(f["findings"][:6]), file=out)
    print(total(tallies).line(), file=out)
