"""``rq`` and ``rqsys`` command lines in process: a mistyped verb answered with
the nearest ones, every bad command line exit 2 (RET_USAGE) with one line
saying why, and the queue named once, as QUEUE or ``--queue``."""

from __future__ import annotations

import pytest

from rqsys.cli.admin import rqsys_main
from rqsys.cli.common import RET_USAGE, check_verb
from rqsys.cli.rq import rq_main


def usage_error(main, argv: list[str], capsys) -> str:
    """The exit code must be RET_USAGE; the last line of stderr."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == RET_USAGE == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "said"), [
    (["sendmsg", "--dest", "q"], "rq: unknown verb 'sendmsg': did you mean sendmesg?"),
    (["qeues"], "rq: unknown verb 'qeues': did you mean queues?"),
    (["--root", "/x", "stat"], "rq: unknown verb 'stat': did you mean stats or state?"),
    (["zzzz"], "rq: unknown verb 'zzzz' (rq --help lists them)"),
])
def test_rq_names_the_nearest_verbs_of_a_mistyped_one(argv, said, capsys):
    assert usage_error(rq_main, argv, capsys) == said


@pytest.mark.parametrize(("argv", "said"), [
    (["serv"], "rqsys: unknown verb 'serv': did you mean serve?"),
    (["--root", "/x", "qeue", "etl"], "rqsys: unknown verb 'qeue': did you mean queue?"),
    (["intsall-units"], "rqsys: unknown verb 'intsall-units': did you mean install-units?"),
])
def test_rqsys_names_the_nearest_verbs_of_a_mistyped_one(argv, said, capsys):
    assert usage_error(rqsys_main, argv, capsys) == said


def test_the_verb_check_skips_roots_value_and_options(capsys):
    verbs = ["queues", "state"]
    check_verb("rq", ["--root", "qeues", "queues"], verbs)  # a root named like a verb
    check_verb("rq", ["--root=/x", "-v", "state", "qeues"], verbs)  # words after the verb
    check_verb("rq", [], verbs)  # argparse says a verb is needed
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(("argv", "said"), [
    (["sendmesg"], "rq sendmesg: error: the following arguments are required: --dest"),
    (["sendmesg", "--dest", "q", "--due", "soon"],
     "rq sendmesg: error: argument --due: invalid float value: 'soon'"),
    (["adminoper", "q", "--oper", "nap"], "rq adminoper: error: argument --oper: invalid choice: "
                                          "'nap' (choose from 'up', 'down', 'pause', 'resume')"),
    (["state"], "rq state: error: the following arguments are required: --msg_id"),
    ([], "rq: error: the following arguments are required: verb"),
])
def test_a_bad_rq_command_line_is_exit_2_saying_why(argv, said, capsys):
    assert usage_error(rq_main, argv, capsys) == said


@pytest.mark.parametrize(("argv", "said"), [
    (["ls"], "rq ls: no queue: name one, as QUEUE or --queue QUEUE"),
    (["ls", "a", "--queue", "b"], "rq ls: two queues: name one, as QUEUE or --queue QUEUE"),
    (["adminoper", "--oper", "up"], "rq adminoper: no queue: name one, as QUEUE or --queue QUEUE"),
])
def test_a_verb_of_one_queue_needs_exactly_one(argv, said, capsys):
    assert usage_error(rq_main, argv, capsys) == said


@pytest.mark.parametrize(("argv", "said"), [
    (["passwd", "--role", "boss"], "rqsys passwd: error: argument --role: invalid choice: "
                                   "'boss' (choose from 'viewer', 'operator', 'admin')"),
    (["queue"], "rqsys queue: error: the following arguments are required: name"),
    (["web", "--port", "http"], "rqsys web: error: argument --port: invalid int value: 'http'"),
    ([], "rqsys: error: the following arguments are required: cmd"),
])
def test_a_bad_rqsys_command_line_is_exit_2_saying_why(argv, said, capsys):
    assert usage_error(rqsys_main, argv, capsys) == said


def test_an_abbreviated_root_option_is_taken_as_argparse_takes_it(capsys):
    check_verb("rq", ["--ro", "/srv/rq", "queues"], ["queues"])
    assert capsys.readouterr().err == ""
