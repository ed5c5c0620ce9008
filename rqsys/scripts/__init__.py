"""The special queues shipped with rqsys: relay, webhook and cleaner (see install.py).

Kept free of imports: each script starts a fresh interpreter per message,
so what they import is paid on every run.
"""
