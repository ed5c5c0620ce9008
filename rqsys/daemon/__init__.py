"""The queue daemon: one process per queue, the sole writer of its directory.

It keeps the loop, the intake, the ops and the state; the run side is
``rqsys.run``, the moments features hook into ``rqsys.life``.  Its rooms,
each a module (``main`` starts it, ``loop`` runs it):

* ``adminfiles``: RQ's admin files of one queue: ``config/<q>.down`` and
  ``config/<q>.pause`` under the root, read at start and on each status
  request, watched with inotify.
* ``after``: Dependencies: queued messages that wait for the messages named in
  their ``after`` (URLs, here or on other hosts) to be ``done``.
* ``afterwatch``: Following the dependencies a queue daemon cannot see itself,
  on one thread of its own: a message of another local queue through that
  queue daemon's ``watch`` op (its end is pushed, never polled), a message on
  another host by a bounded poll of its ``state.json`` through the relay's
  HTTP client.
* ``bulk``: Bulk enqueue: many new messages in one request (``create_many``),
  made durable by one group commit and answered in order.
* ``bulkdelete``: A bulk delete (a search's matches, or a failure group),
  ``STEP`` messages a step: each is synced on its own, and the next step
  starts once they are durable, so the loop serves every other client in
  between.
* ``bulkmove``: A bulk move: messages of this queue made anew in another
  queue, then deleted here, ``STEP`` at a time.
* ``bulkretry``: A bulk retry (err → que of many messages), its disk work off
  the loop.
* ``bulksteps``: The stepping of a bulk action (a move or a delete of many
  messages): a step of the list at a time, each waiting until none of its
  messages is busy (in a retry batch, so it is decided where the batch leaves
  it), the next once the step's work has called back; the answer after the
  last.
* ``context``: What every room of the daemon reads about its queue: name,
  config, admin state.
* ``copyhealth``: The health of the daemon's copies of its store: the
  messages' timelines and the search index.  Their writes never fail a message
  (the store is the truth), so a write that fails is counted where it happens;
  this module shows the counts in ``stats`` and tells the log when they change
  (once per change, not per failure: a full disk fails every line).
* ``features``: The optional features a queue's config asks for, built before
  their users and registered for their moments (tracing, a pool).
* ``gates``: Whether a due message may start now: the queue's concurrency
  limits (``blocking_params`` is the limit-1 case) and its rate limit, each
  counted globally or per tuple of parameters.
* ``intake``: New messages coming in: create, clone, a local dup, attachments,
  and the group commit that makes a turn's new messages durable before any is
  answered.
* ``ledger``: The daemon's picture of its messages: what
  ``rqsys.daemon.transitions`` keeps in step.
* ``loop``: The daemon's event loop: start-up, the fixed phases of a turn,
  idle, stop, reload and the STATUS= line (supervisor's ``runforever`` shape).
* ``loopclock``: Where a queue daemon's event loop spends its time.
* ``main``: ``rqsys queue NAME``: a queue daemon's start: room for its fds,
  its socket, its loop.
* ``observe``: What the daemon tells about itself: the sinks of its events
  (timelines, statistics, watchers) and the ``stats`` and ``watch`` socket
  operations.
* ``ops``: The socket operations, and the table that names every one of them.
* ``outbound``: Everything that talks to another queue daemon: a script's dup
  to another queue, and queueing a post_run_webhook call.  Never on the loop.
* ``removals``: any → gone: a client's delete and the cleaner's prune, two
  transitions of the daemon's.
* ``retries``: err → que: a client's retry of failed messages, one at a time
  or a bulk retry's batch, as one transition of ``rqsys.daemon.transitions``.
* ``scheduler``: The in-memory que of one queue: which message runs next
  (priority, due time, arrival), blocking keys and coalescing.
* ``searchops``: The ``search`` and ``bulk`` socket operations, and the
  batches that carry out an action on many messages while the queue keeps
  answering.
* ``server``: The daemon's socket server: listener, connections, framing, and
  dispatch over an explicit table of operations.
* ``tags``: Tags: the listing of one state's messages that carry a tag
  (``list``'s ``tag``).
* ``transitions``: Where a message changes state: the only place in the daemon
  that moves one.
* ``unique``: Unique messages: which message of the queue holds each unique
  key.

Slow work runs on background threads (``rqsys.background``): attachments are
hashed on one lane, the fsyncs an answer waits for on another, each peer
daemon is called on a lane of its own; spare message directories are made
on the store's thread.  The loop itself never waits on any of them, nor on
another process.  A clean stop with many queued messages leaves
``que.snapshot`` for a fast next start (see ``rqsys.store``).
"""
