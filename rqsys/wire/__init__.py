"""Talking to a queue daemon over its socket: the framing (framing), the client
(client) and bulk sends from NDJSON or JSON (bulk).
"""
