"""The compiled spawn helper (built by cffi from spawn.c at install time)."""
