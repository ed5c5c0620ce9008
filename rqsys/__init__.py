"""rqsys: a reliable, filesystem-backed message queue for any Unix language."""

__version__ = "0.2.0"
