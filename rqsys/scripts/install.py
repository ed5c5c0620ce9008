"""Old home of the special-queue installer, now :mod:`rqsys.special`.

Kept only so tests that still import from here keep running while their
owners move them to ``rqsys.special``; delete it then.
"""

from rqsys.special import SPECIAL_QUEUES as SPECIAL_QUEUES
from rqsys.special import install_special_queues as install_special_queues
from rqsys.special import special_config as special_config
