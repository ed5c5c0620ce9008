"""Talking to a queue daemon over its socket: the framing (framing), the shape
of every request, one JSON Schema per operation (schema), the client (client)
and bulk sends from NDJSON or JSON (bulk).
"""
