"""One run of a queue script: starting it (spawn), the fd-3 grammar (protocol),
its verdict when it ends (verdict), automatic retries and their back-off
(backoff), where its output goes (output), its cgroup or systemd scope and
their limits (cgroups, scopes, limits).
"""
