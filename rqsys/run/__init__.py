"""The run side of a queue daemon: one table of running scripts, split by action.

* ``runner``: the table (``Runner.workers``), and a start; ``scriptcheck``
  whether the queue's script can start (SCRIPTERROR).
* ``lines``: a running script's status and ``dup`` lines on fd 3, fd 4's answers.
* ``exits``: an exit, its verdict, and where the message goes.
* ``starts``: the spawn helper and the fork server as the runner calls them;
  ``spawn`` and ``forkserver`` beneath them.
* ``children``: the running scripts' status pipes and pidfds.
* ``stops``: timeouts, a cancel, a destroy, the daemon's stop; ``deadlines``
  their timed actions on the loop's clock.
* ``leftovers`` and ``procs``: what a run left behind it.
* ``environment``: a script's environment; ``credentials`` and ``identity``
  (``unituser`` under systemd) the secrets and the user it runs with.
* ``limits``: per-run limits (``cgroups``, ``scopes``, rlimits from ``resources``).
* ``dups``: fd 3's ``dup`` requests; ``handoff``: a relay run handed over, no exec.
* ``protocol`` (the fd-3 grammar), ``verdict`` (the end of a run),
  ``backoff`` (automatic retries), ``output`` (stdout and stderr).
"""
