"""Backup and restore of a live root: each message once, in a state it had.

``rqsys backup DEST`` (``copy``) finds the messages (``walk``, with the
moves seen meanwhile by ``watch``), copies them and the root's other files
(``files``) and writes the ``manifest`` last; ``rqsys restore SRC ROOT``
(``restore``) checks a backup against its manifest and puts it in place.
See docs/OPERATING.md, "Backups".
"""
