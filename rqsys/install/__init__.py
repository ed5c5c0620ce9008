"""Putting rqsys in place on a host: the systemd units, sysusers and tmpfiles
(units: ``rqsys install-units``), and a pip install's commands and man pages
linked into a prefix (system: ``rqsys install-system``).
"""
