"""What happened to messages and queues: the daemons' own log (events), a
message's timeline (timeline), millisecond stamps (stamps), statistics and
their series and files (stats, statseries, statsfile), failure groups
(failures) and a failed run's last lines (lastlines).
"""
