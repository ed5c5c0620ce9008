"""A message's life in one place: its named moments, and the features that hook into them.

* ``moments``  the named moments of a message's life and of its queue daemon's
  loop, and the hooks features register for them when a queue is built
  (``rqsys.daemon.features`` registers what a queue's config asks for)
"""
