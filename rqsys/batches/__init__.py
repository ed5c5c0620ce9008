"""Batches: many messages made at once, with a callback once all have ended."""
