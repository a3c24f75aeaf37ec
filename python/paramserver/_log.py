"""The library's log lines (a shard's path, a retry, a failover) through Python's logging, on the
logger "paramserver" at INFO, WARNING and ERROR: an application shows, routes or quiets them as
any other, e.g. logging.getLogger("paramserver").setLevel(logging.ERROR). Without a logging
configuration, Python prints WARNING and above to stderr (its last-resort handler)."""
import atexit
import logging

from ._native import LogSink, lib

logger = logging.getLogger("paramserver")
_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR)


@LogSink
def _sink(level, message, _arg):
    # Called on the library's threads (ctypes takes the GIL); the level as logging names it.
    logger.log(_LEVELS[level] if 0 <= level < len(_LEVELS) else logging.ERROR, "%s",
               message.decode(errors="replace"))


lib.ps_set_log_sink(_sink, None)
# Lines logged while the interpreter shuts down go to stderr again, not into a logging module
# being torn down.
atexit.register(lib.ps_set_log_sink, LogSink(), None)  # LogSink(): a null pointer
