"""Timers: periodic messages from timer files (periodic), calendar and cron
expressions (calendar), slots without systemd (slots), systemd timer units
(units), and what the listings show (listing).
"""
