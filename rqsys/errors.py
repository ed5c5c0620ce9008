"""The one root of every error rqsys raises on purpose."""


class RQError(Exception):
    """Base of all rqsys errors; its text is shown to the user as is."""


class ConfigError(RQError):
    """A configuration file or message is invalid (names the file and field)."""


class NotFound(RQError):
    """A queue, message or attachment does not exist."""


class BadRequest(RQError):
    """A request is malformed or not allowed in the current state."""


class Forbidden(RQError):
    """The request is understood but not allowed: a role it needs, or a feature turned off."""


class TooLarge(BadRequest):
    """A request, or one of its fields, is over its size limit (names the field and the limit)."""


class QueueDown(RQError):
    """The queue is administratively DOWN (or PAUSEd, for new messages)."""


class StoreError(RQError):
    """The on-disk store could not complete an operation."""


class NoSpace(StoreError):
    """The state file system is full (blocks or inodes): nothing was half-made."""


class ProtocolError(RQError):
    """A peer spoke the socket protocol wrongly."""


class SpawnError(RQError):
    """A queue script could not be started."""


class Unavailable(RQError):
    """A queue daemon could not be reached."""


class NotSent(Unavailable):
    """A request that never reached the daemon (the connection failed while
    sending it): sending it again on a new connection cannot do it twice."""


class InternalError(RQError):
    """A bug in rqsys, not the client's fault."""
