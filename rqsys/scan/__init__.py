"""rq-scan: scandir entries into queue directories (scandir), the inotify loop
(watcher) and its bookkeeping (watches), and putting queues in and out of
service (enabler).
"""
