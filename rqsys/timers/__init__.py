"""Timers: periodic messages from timer files (periodic), calendar and cron
expressions (calendar), slots without systemd (slots), systemd timer units
(units), each timer's record of its last message and skipped slots (history),
and what the listings show (listing).
"""
