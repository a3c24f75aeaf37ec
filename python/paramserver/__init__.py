"""paramserver: the Python client of the parameter servers (see docs/pytorch.md).

    import paramserver
    with paramserver.Client(ps="localhost:50051", model="flat:1000", rank=0) as client:
        step = client.register()
        ...
"""
from ._version import __version__  # noqa: F401  (generated from CMake's project(VERSION))
from . import _log  # noqa: F401  (the library's log lines go to the "paramserver" logger)
from .client import Client, Handle, PushSummary
from .errors import (Aborted, Cancelled, DeadlineExceeded, Error, FailedPrecondition,
                     InvalidArgument, Unauthenticated, Unavailable)
from .model_file import load_file, read_file

__all__ = ["Client", "Handle", "PushSummary", "Error", "Aborted", "Cancelled", "DeadlineExceeded",
           "FailedPrecondition", "InvalidArgument", "Unauthenticated", "Unavailable", "load_file",
           "read_file"]
