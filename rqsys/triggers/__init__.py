"""Triggers: work that arrives by itself, from ``<root>/triggers/<name>.json``.

Rooms: ``spec`` (the files and their schema), ``record`` (each trigger's
fires), ``listing`` (``rq triggers``, ``/triggers.json``), and the webhook
kind: ``webhook`` (a delivery made into a message), ``signatures``,
``params``, ``secrets``.  The web serves ``POST /hooks/<name>``
(``rqsys.web.hooks``).
"""
