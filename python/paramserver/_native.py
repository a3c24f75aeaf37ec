"""Loads libparamserver_c.so (capi/paramserver_c.h) through ctypes and declares its functions.

ctypes releases the GIL during every call, so other Python threads run while a call waits on the
shards, and the library depends on no interpreter's ABI: one build serves every Python 3.
"""
import ctypes
import os

from ._version import __version__

API_VERSION = 8
NOT_DONE = -1
# ps_log_sink: (level 0 info, 1 warning, 2 error; the message; the caller's pointer)
LogSink = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class PushSummary(ctypes.Structure):
    _fields_ = [
        ("sequence", ctypes.c_int64),
        ("max_staleness", ctypes.c_int64),
        ("duplicates", ctypes.c_int32),
        ("dropped", ctypes.c_int32),
        ("saturated", ctypes.c_int64),
    ]


def _library_path():
    explicit = os.environ.get("PARAMSERVER_LIBRARY")
    if explicit:
        return explicit
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libparamserver_c.so")


def _check_release(lib, path):
    """Refuses a library of another release than this package, naming both."""
    ours = f"paramserver {__version__}"
    if not hasattr(lib, "ps_version"):
        theirs = "an older release (it has no ps_version)"
    else:
        lib.ps_version.restype = ctypes.c_char_p
        theirs = lib.ps_version().decode()  # "paramserver 1.3.0 (3a22abf, Release, CUDA on)"
        if theirs.startswith(ours + " "):
            return
    raise ImportError(f"paramserver: {path} is {theirs}, this Python package is {ours}: "
                      "install the package and library of one release (rebuild the project, or "
                      "pip install the wheel again)")


def _load():
    path = _library_path()
    if not os.path.exists(path):
        raise ImportError(
            f"paramserver: {path} is missing: build the project (deploy/setup.sh or "
            "cmake --build build) and put build/python on PYTHONPATH, or set PARAMSERVER_LIBRARY")
    lib = ctypes.CDLL(path)
    _check_release(lib, path)
    if lib.ps_api_version() != API_VERSION:
        raise ImportError(f"paramserver: {path} has C API version {lib.ps_api_version()}, "
                          f"this package needs {API_VERSION}: rebuild the project")
    client_p, op_p, exchange_p, step_p = (ctypes.c_void_p,) * 4
    i64, f32p = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
    declare = {
        "ps_last_error": (ctypes.c_char_p, []),
        "ps_set_log_sink": (None, [LogSink, ctypes.c_void_p]),
        "ps_setting_names": (ctypes.c_char_p, []),
        "ps_client_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(client_p)]),
        "ps_client_destroy": (None, [client_p]),
        "ps_client_cancel_pending": (None, [client_p]),
        "ps_client_register": (ctypes.c_int, [client_p, ctypes.POINTER(i64)]),
        "ps_client_total_params": (i64, [client_p]),
        "ps_client_num_shards": (ctypes.c_int, [client_p]),
        "ps_client_rank": (ctypes.c_int, [client_p]),
        "ps_client_consistency": (ctypes.c_char_p, [client_p]),
        "ps_client_initialize": (ctypes.c_int, [client_p, f32p, i64, ctypes.POINTER(ctypes.c_int)]),
        "ps_client_pull": (ctypes.c_int, [client_p, f32p, i64, ctypes.c_int, ctypes.POINTER(op_p)]),
        "ps_client_shard_range": (ctypes.c_int, [client_p, ctypes.c_int, ctypes.POINTER(i64),
                                                 ctypes.POINTER(i64)]),
        "ps_client_push": (ctypes.c_int, [client_p, f32p, i64, i64, ctypes.c_int,
                                          ctypes.POINTER(op_p)]),
        "ps_op_send": (ctypes.c_int, [op_p, ctypes.c_int]),
        "ps_op_filled": (ctypes.c_int, [op_p, i64]),
        "ps_op_wait": (ctypes.c_int, [op_p, ctypes.c_double]),
        "ps_op_wait_part": (ctypes.c_int, [op_p, ctypes.c_int, ctypes.c_double]),
        "ps_op_wait_values": (ctypes.c_int, [op_p, i64, i64, ctypes.c_double]),
        "ps_op_versions": (ctypes.c_int, [op_p, ctypes.POINTER(i64), ctypes.c_int]),
        "ps_op_push_summary": (ctypes.c_int, [op_p, ctypes.POINTER(PushSummary)]),
        "ps_op_free": (None, [op_p]),
        "ps_client_step": (ctypes.c_int, [client_p, f32p, f32p, i64, ctypes.c_int,
                                          ctypes.POINTER(step_p)]),
        "ps_step_weights_needed": (ctypes.c_int, [step_p, i64, i64, ctypes.c_double]),
        "ps_step_wait_pull": (ctypes.c_int, [step_p, ctypes.c_double]),
        "ps_step_gradient_final": (ctypes.c_int, [step_p, i64, i64]),
        "ps_step_final": (ctypes.c_int, [step_p, i64, i64]),
        "ps_step_filled_from": (i64, [step_p]),
        "ps_step_take_push": (ctypes.c_int, [step_p, ctypes.POINTER(op_p)]),
        "ps_step_free": (None, [step_p]),
        "ps_client_local_models": (ctypes.c_int, [client_p]),
        "ps_client_exchange": (ctypes.c_int, [client_p, f32p, i64, ctypes.POINTER(exchange_p)]),
        "ps_exchange_before_step": (ctypes.c_int, [exchange_p, i64]),
        "ps_exchange_after_step": (ctypes.c_int, [exchange_p, i64, ctypes.c_int]),
        "ps_exchange_wait": (ctypes.c_int, [exchange_p, ctypes.c_double]),
        "ps_exchange_free": (None, [exchange_p]),
        "ps_client_stats_json": (ctypes.c_int, [client_p, ctypes.POINTER(ctypes.c_void_p)]),
        "ps_string_free": (None, [ctypes.c_void_p]),
    }
    for name, (restype, argtypes) in declare.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()
