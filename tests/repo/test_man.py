"""The man pages build with scdoc, pass ``mandoc -Tlint -W error``, and say
what the code does: every rq verb and option, every rqsys subcommand and
option, every JSON Schema field with its type and default, every RQ_*
variable a script gets and every status command, every CLI exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, need, wait_for

from rqsys import config
from rqsys.cli import admin
from rqsys.cli import rq as cli
from rqsys.run import protocol
from rqsys.store import QueueStore

MAN = REPO / "man"
PAGES = ["rq.1", "rqsys.8", "rq-queue-script.7", "rqsys.json.5"]


def scdoc(source: Path, out: Path) -> subprocess.CompletedProcess[bytes]:
    need(shutil.which("scdoc") is not None, "scdoc (Debian scdoc)")
    with source.open("rb") as src, out.open("wb") as dst:
        return subprocess.run(["scdoc"], stdin=src, stdout=dst, stderr=subprocess.PIPE,
                              timeout=30)


def mandoc_lint(page: Path) -> subprocess.CompletedProcess[str]:
    need(shutil.which("mandoc") is not None, "mandoc (Debian mandoc)")
    return subprocess.run(["mandoc", "-Tlint", "-W", "error", str(page)],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("man")
    pages = {}
    for page in PAGES:
        done = scdoc(MAN / f"{page}.scd", out / page)
        assert done.returncode == 0, done.stderr.decode()
        pages[page] = out / page
    return pages


def source(page: str) -> str:
    return (MAN / f"{page}.scd").read_text()


def bold_words(text: str) -> set[str]:
    return set(re.findall(r"\*([^*\s][^*]*?)\*", text))


# ------------------------------------------------------------------ build + lint
def test_every_page_source_is_there() -> None:
    assert sorted(p.name for p in MAN.glob("*.scd")) == sorted(f"{p}.scd" for p in PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_page_passes_mandoc_lint(built: dict[str, Path], page: str) -> None:
    done = mandoc_lint(built[page])
    assert done.returncode == 0 and not done.stdout and not done.stderr, done.stdout + done.stderr


def test_lint_catches_a_broken_page(tmp_path: Path) -> None:
    broken = tmp_path / "broken.1"
    broken.write_text('.TH BROKEN 1\n.SH NAME\nbroken \\- x\n.RE\n.SH\n.BI\n.de\n')
    done = mandoc_lint(broken)
    assert done.returncode != 0 and "ERROR" in done.stdout + done.stderr


def test_scdoc_refuses_a_bad_source(tmp_path: Path) -> None:
    bad = tmp_path / "bad.1.scd"
    bad.write_text("no-header-here\n\n# NAME\n")
    done = scdoc(bad, tmp_path / "bad.1")
    assert done.returncode != 0 and done.stderr


# ------------------------------------------------------------------ rq(1)
def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings
            if opt.startswith("--") and opt != "--help"}


def test_rq1_documents_every_verb_and_option() -> None:
    text, words = source("rq.1"), bold_words(source("rq.1"))
    verbs = subparsers(cli.rq_parser())
    assert verbs, "rq has verbs"
    for verb, parser in verbs.items():
        assert verb in words, f"rq verb {verb} missing from rq(1)"
        assert f"\n*{verb}*\n\t" in text, f"rq verb {verb} has no entry in rq(1) VERBS"
        for option in long_options(parser):
            assert option in words, f"rq {verb} {option} missing from rq(1)"
    for option in long_options(cli.rq_parser()):
        assert option in words


def test_rq1_exit_status_matches_the_cli() -> None:
    section = source("rq.1").split("# EXIT STATUS", 1)[1].split("\n# ", 1)[0]
    documented = {int(n) for n in re.findall(r"^\*(\d+)\*$", section, re.M)}
    codes = {value for name, value in vars(cli).items() if name.startswith("RET_")}
    assert documented == codes


def test_rqsys8_documents_every_subcommand_and_option() -> None:
    words = bold_words(source("rqsys.8"))
    for cmd, parser in subparsers(admin.rqsys_parser()).items():
        assert cmd in words or f"rqsys {cmd}" in words, f"rqsys {cmd} missing from rqsys(8)"
        for option in long_options(parser):
            assert option in words or f"{cmd} {option}" in words, \
                f"rqsys {cmd} {option} missing from rqsys(8)"


def test_rqsys8_names_the_units_that_exist() -> None:
    text = source("rqsys.8")
    units = [p.name for p in (REPO / "units").glob("rq*") if p.is_file()]
    need(bool(units), "units/ written (systemd issue)")
    for unit in units:
        if unit != "rq.target":
            assert f"*{unit}*" in text, f"unit {unit} missing from rqsys(8)"


# ------------------------------------------------------------------ rq-queue-script(7)
ENV_SCRIPT = """\
env | grep -o '^RQ_[A-Z0-9_]*' | sort
echo "done listed" >&3
"""


def script_env_names(make_queue: Any, daemon: Any) -> set[str]:
    """The RQ_* variables a real queue daemon gives a real script."""
    make_queue("envlist", ENV_SCRIPT, shebang="#!/bin/sh", budget={"gpus": ["0"]})  # RQ_GPUS
    proc = daemon("envlist")
    msg_id = proc.call("create", msg={})["msg_id"]
    got = wait_for(lambda: finished(proc, msg_id), 20, "the env script to finish")
    assert got["state"] == "done", got
    store = QueueStore(proc.layout.queue_dir("envlist"))
    log = store.msg_dir("done", msg_id) / "job" / "stdio.log"
    inherited = {name for name in os.environ if name.startswith("RQ_")}
    return set(log.read_text().split()) - inherited


def test_script_page_documents_exactly_the_environment(make_queue, daemon) -> None:
    names = script_env_names(make_queue, daemon)
    assert {"RQ_MSG_ID", "RQ_WRITE", "RQ_PARAM4"} <= names  # the script saw them
    section = source("rq-queue-script.7").split("# ENVIRONMENT", 1)[1].split("\n# ", 1)[0]
    documented = set(re.findall(r"\*(RQ_[A-Z0-9_]+)\*", section)) - {"RQ_"}
    assert names - documented == set(), "undocumented in rq-queue-script(7)"
    assert documented - names == set(), "documented but not set by the daemon"


def test_script_page_documents_every_status_command() -> None:
    section = source("rq-queue-script.7").split("# THE STATUS GRAMMAR", 1)[1]
    section = section.split("\n# ", 1)[0]
    for command in protocol.COMMANDS:
        assert re.search(rf"^\*{command}\* ", section, re.M), f"{command} missing"
    assert f"{protocol.MAX_TEXT} characters" in section


# ------------------------------------------------------------------ rqsys.json(5)
def schema_fields(schema: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(name, spec) of every property, nested ones included."""
    fields = []
    for name, spec in schema.get("properties", {}).items():
        fields.append((name, spec))
        fields.extend(schema_fields(spec, f"{prefix}{name}."))
    for pattern, spec in schema.get("patternProperties", {}).items():
        alternatives = re.search(r"\((.*)\)", pattern)
        assert alternatives, pattern
        stem = pattern[1:pattern.index("(")]
        fields.extend((stem + name, spec) for alt in alternatives.group(1).split("|")
                      for name in expand_class(alt))
        fields.extend(schema_fields(spec, prefix))
    return fields


def field_entry(text: str, name: str, types: tuple[str, ...] = ()) -> str:
    """The definition (heading + indented body) whose heading names ``name``
    (and ``types``, when two schemas give one name different types)."""
    for match in re.finditer(r"^(\*.+)\n((?:\t.*\n?)+)", text, re.M):
        names = match.group(1).split("(", 1)[0]  # the heading's names, not its type words
        if re.search(rf"\*{re.escape(name)}\*", names) and \
                all(t in match.group(1) for t in types):
            return match.group(0)
    return ""


def default_words(value: Any) -> str:
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value)


def expand_class(alternative: str) -> list[str]:
    """``param[1-4]`` -> param1 .. param4 (the only regex class the schemas use)."""
    found = re.fullmatch(r"(\w*)\[(\d)-(\d)\]", alternative)
    if not found:
        return [alternative]
    return [f"{found.group(1)}{n}" for n in range(int(found.group(2)), int(found.group(3)) + 1)]


@pytest.mark.parametrize("schema_name", config.SCHEMAS)
def test_json_page_documents_every_field_type_and_default(schema_name: str) -> None:
    text = source("rqsys.json.5")
    for name, spec in schema_fields(config.schema(schema_name)):
        types = spec.get("type", [])
        entry = field_entry(text, name, (types,) if isinstance(types, str) else tuple(types))
        if not entry and name.startswith(("param2", "param3", "param4")):
            entry = field_entry(text, "param1")
        if not entry and re.fullmatch(r"mesg_param[2-4]", name):
            entry = field_entry(text, "mesg_param1")
        if not entry:  # a nested field described inside its parent's entry
            assert f"*{name}*" in text, f"{schema_name}.json field {name} missing"
            continue
        heading = entry.splitlines()[0]
        entry = " ".join(entry.split())
        types = spec.get("type", [])
        for type_name in [types] if isinstance(types, str) else types:
            # a nested field may share its name with another schema's entry
            # (retry's jitter, a timer's jitter): then it is in its parent's
            inline = f"*{name}* ({type_name}" in text
            assert type_name in heading or inline, f"{name}: type {type_name} not in {heading!r}"
        if "default" in spec:
            words = default_words(spec["default"])
            assert f"Default: *{words}*" in entry, f"{name}: default {words} not in {entry!r}"


def test_field_entry_finds_definitions() -> None:
    # The helper the check above relies on finds a known entry and no phantom.
    text = source("rqsys.json.5")
    assert "Default: *3333*" in field_entry(text, "port")
    assert field_entry(text, "no_such_field") == ""


# ------------------------------------------------------------------ the examples work
def example_scripts() -> dict[str, str]:
    """The complete scripts in rq-queue-script(7)'s EXAMPLES, by interpreter."""
    examples = source("rq-queue-script.7").split("# EXAMPLES", 1)[1].split("\n# ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", examples, re.S)
    return {block.split("\n", 1)[0]: block for block in blocks if block.startswith("#!")}


def finished(proc: Any, msg_id: str) -> dict[str, Any] | None:
    """The message once its script has ended (get's answer), else None."""
    got = proc.call("get", msg_id=msg_id)
    return got if got["state"] != "run" and got["status"] else None


def test_the_page_has_a_shell_and_a_python_example() -> None:
    assert set(example_scripts()) == {"#!/bin/bash", "#!/usr/bin/env python3"}


@pytest.mark.parametrize("interpreter", ["#!/bin/bash", "#!/usr/bin/env python3"])
def test_example_script_runs_to_done(interpreter: str, layout, make_queue, daemon,
                                     tmp_path: Path) -> None:
    need(shutil.which("curl") is not None or "python" in interpreter, "curl")
    # Given the page's example as a queue script, and a page to fetch
    shebang, body = example_scripts()[interpreter].split("\n", 1)
    make_queue("fetch", body, shebang=shebang)
    page = tmp_path / "page.html"
    page.write_text("<p>hello</p>\n")
    proc = daemon("fetch")
    # When a message names the page
    msg_id = proc.call("create", msg={"param1": page.as_uri()})["msg_id"]
    # Then the script fetched it and said done with its size
    got = wait_for(lambda: finished(proc, msg_id), 20, "the example to finish")
    assert (got["state"], got["status"]) == ("done", f"{page.stat().st_size} bytes")


def test_example_script_resends_on_a_failed_fetch(layout, make_queue, daemon,
                                                  tmp_path: Path) -> None:
    # Given the page's Python example as a queue script
    shebang, body = example_scripts()["#!/usr/bin/env python3"].split("\n", 1)
    make_queue("fetch", body, shebang=shebang)
    proc = daemon("fetch")
    # When the page it should fetch does not exist
    msg_id = proc.call("create", msg={"param1": (tmp_path / "missing").as_uri()})["msg_id"]
    # Then it is back in que with the reason, for a later run
    got = wait_for(lambda: finished(proc, msg_id), 20, "the example to finish")
    assert got["state"] == "que" and "No such file" in got["status"], got


# ------------------------------------------------------------------ nothing stale
def test_rq1_documents_no_verb_that_does_not_exist() -> None:
    section = source("rq.1").split("# VERBS", 1)[1].split("\n# ", 1)[0]
    documented = set(re.findall(r"^\*(\w+)\*$", section, re.M))
    assert documented == set(subparsers(cli.rq_parser()))


def example_command_lines() -> list[tuple[str, list[str]]]:
    """Every ``rq ...`` / ``rqsys ...`` line in the pages' code blocks, as argv."""
    lines = []
    for page in PAGES:
        for block in re.findall(r"```\n(.*?)```", source(page), re.S):
            for line in block.splitlines():
                line = line.removeprefix("$ ").split(" &", 1)[0].split(" #", 1)[0]
                if re.match(r"(if ! url=\$\()?rq(sys)? ", line):
                    line = re.sub(r"^if ! url=\$\((.*)\); then$", r"\1", line)
                    lines.append((page, shlex.split(line)))
    return lines


def test_pages_have_command_line_examples() -> None:
    commands = {argv[0] for _page, argv in example_command_lines()}
    assert commands == {"rq", "rqsys"}


@pytest.mark.parametrize(("page", "argv"), example_command_lines(),
                         ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_example_command_line_parses(page: str, argv: list[str]) -> None:
    parser = cli.rq_parser() if argv[0] == "rq" else admin.rqsys_parser()
    try:
        parser.parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{page}: {' '.join(argv)} is refused by the CLI (exit {exc.code})")
