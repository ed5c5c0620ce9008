"""Searching a queue's messages: the SQLite index a daemon thread keeps
(index), events folded into row writes (fold), the queries (query), and the
console's filter language over them (filters).
"""
