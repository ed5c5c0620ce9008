"""Triggers: work that arrives by itself, from ``<root>/triggers/<name>.json``.

Rooms: ``spec`` (the files and their schema), ``record`` (each trigger's
fires), ``listing`` (``rq triggers``, ``/triggers.json``); the webhook kind:
``webhook`` (a delivery made into a message), ``signatures``, ``params``,
``secrets``, served by the web (``POST /hooks/<name>``, ``rqsys.web.hooks``);
the files kind: ``files`` (rq-scan's loop side: watches and catch-up) and
``filework`` (the job side: a complete file made into one message, ``then``);
the journal kind: ``journal`` (the loop side: a journal reader in rq-scan's
selector) and ``journalwork`` (the job side: entries made into messages, the
cursor kept, bursts folded).
"""
