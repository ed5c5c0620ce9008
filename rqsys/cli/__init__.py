"""The command lines: ``rq`` (RQ's client verbs: rq), ``rqsys`` (the daemons
and admin verbs: admin), what both share (common: exit codes, --root),
following a message (follow), job control (jobs) and the verbs that watch
queues (observe).
"""
