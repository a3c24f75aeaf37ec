"""Exceptions of the paramserver client: every failure of the shards or of a call, with the
shard's message. Each is a paramserver.Error and also the closest built-in exception, so that
`except ValueError` or `except ConnectionError` work as they would elsewhere."""

_CODE_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A call failed. `code` is the gRPC/absl status name (e.g. "UNAVAILABLE")."""

    def __init__(self, code, message):
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


class InvalidArgument(Error, ValueError):
    """Bad input: a wrong length, dtype or layout, a bad setting, a gradient the shards refuse."""


class FailedPrecondition(Error, RuntimeError):
    """The call does not fit the job's state (a closed client, a model lost by a shard, ...)."""


class Unauthenticated(Error, PermissionError):
    """No token or a wrong one (UNAUTHENTICATED), or one without the right (PERMISSION_DENIED)."""


class Unavailable(Error, ConnectionError):
    """The shards could not be reached within the retry budget."""


class DeadlineExceeded(Error, TimeoutError):
    pass


class Aborted(Error):
    """A pull failed after some of its values were used (Handle.wait_values): a retry would have
    rewritten them, so none was made. Compute again on a new pull."""


class Cancelled(Error):
    """The call was ended by close() (or the shard shutting down, after the retries)."""


_CLASSES = {
    "INVALID_ARGUMENT": InvalidArgument, "OUT_OF_RANGE": InvalidArgument,
    "NOT_FOUND": InvalidArgument, "FAILED_PRECONDITION": FailedPrecondition,
    "UNAUTHENTICATED": Unauthenticated, "PERMISSION_DENIED": Unauthenticated,
    "UNAVAILABLE": Unavailable, "DEADLINE_EXCEEDED": DeadlineExceeded, "CANCELLED": Cancelled,
    "ABORTED": Aborted,
}


def invalid(message):
    """The InvalidArgument this package raises for bad input found before any call."""
    return InvalidArgument("INVALID_ARGUMENT", message)


def from_code(code, message):
    name = _CODE_NAMES.get(code, f"CODE_{code}")
    return _CLASSES.get(name, Error)(name, message)
