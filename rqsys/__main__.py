"""``python -m rqsys`` runs the ``rqsys`` command (the supervisor starts its children so)."""

import sys

from rqsys.cli.admin import rqsys_main

sys.exit(rqsys_main())
