"""Searching a queue's messages: the SQLite index a daemon thread keeps
(index), events folded into row writes (fold), and the queries (query).
"""
