"""The client of the parameter servers: one flat float32 vector of total_params values, split over
the shards, pulled into and pushed from the caller's own NumPy arrays or PyTorch CPU tensors
without a copy. It wraps the C++ client (client/sharded_client.h) through capi/paramserver_c.h:
the same retries, deadlines, replicas, TLS, tokens, shared memory and wire types as the daemons.
"""
import ctypes
import json
import os
import threading
import time
import weakref
from collections import namedtuple

import numpy as np

from . import errors
from .errors import invalid
from ._native import NOT_DONE, PushSummary as _PushSummary, lib

PushSummary = namedtuple("PushSummary", "sequence max_staleness duplicates dropped saturated")
PushSummary.__doc__ = """What a push did: the sequence it carried, the largest staleness over the
shards, how many shards had applied it before (duplicates) or dropped it by their consistency
policy, and how many gradient values exceeded the wire type's range."""


def settings_from_environment(environ=None):
    """The client settings that `launch --worker_cmd` (and --eval_cmd) hand a command through
    its environment, each flag --name=value as PS_NAME=value: {"ps": $PS_PS, "rank": $PS_RANK,
    "token_file": $PS_TOKEN_FILE, ...}, for those of Client's settings that are set, as their
    text (Client checks them). Like torch.distributed's env:// initialisation."""
    environ = os.environ if environ is None else environ
    names = lib.ps_setting_names().decode().split(",")
    return {name: environ["PS_" + name.upper()] for name in names
            if "PS_" + name.upper() in environ}


def _raise_last(code):
    raise errors.from_code(code, lib.ps_last_error().decode(errors="replace"))


def _sliced(wait, timeout, what):
    """Calls wait(seconds) in short slices (Ctrl-C, KeyboardInterrupt, and signal handlers run
    between them) until it returns other than NOT_DONE or `timeout` passed; raises its error."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 0.1 if end is None else min(0.1, max(0.0, end - time.monotonic()))
        code = wait(left)
        if code != NOT_DONE:
            break
        if end is not None and time.monotonic() >= end:
            raise TimeoutError(f"the {what} is still in progress after {timeout} s")
    if code != 0:
        _raise_last(code)


def float_buffer(x, writable, what):
    """(address, count, owner): the memory of `x` (a float32 C-contiguous NumPy array, CPU torch
    tensor or buffer), used in place. Raises InvalidArgument for anything else."""
    if type(x).__module__.split(".")[0] == "torch":
        import torch
        if x.device.type != "cpu":
            raise invalid(f"{what} is on {x.device}; the client reads and writes CPU tensors")
        if x.dtype != torch.float32:
            raise invalid(f"{what} has dtype {x.dtype}; the shards hold torch.float32")
        if not x.is_contiguous():
            raise invalid(f"{what} is not contiguous: pass tensor.contiguous() (a copy) or a "
                       "contiguous buffer")
        return x.data_ptr(), x.numel(), x
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(memoryview(x))  # a view, with the buffer's own element type
        except TypeError:
            raise invalid(f"{what} must be a NumPy array, a torch tensor or a buffer of float32, "
                       f"not {type(x).__name__}") from None
    if x.dtype != np.float32:
        raise invalid(f"{what} has dtype {x.dtype}; the shards hold float32")
    if not x.flags.c_contiguous or not x.flags.aligned:
        raise invalid(f"{what} is not C-contiguous and aligned: pass np.ascontiguousarray(...)")
    if writable and not x.flags.writeable:
        raise invalid(f"{what} is read-only; a pull writes into it")
    return x.ctypes.data, x.size, x


class Handle:
    """A pull or push in progress (from pull_async / push_async). wait() returns its result or
    raises its error; the buffer it reads or writes is kept alive, and must not be touched, until
    it ended. A push started with held=True sends shard s's part at send(s); wait() sends the
    parts still held, and a handle dropped (or abandon()ed) before sends none of them."""

    def __init__(self, op, owner, kind, num_shards):
        self._op = op
        self._owner = owner
        self._kind = kind
        self._num_shards = num_shards
        self._result = None

    def send(self, shard):
        """Sends shard `shard`'s part of a push started held (its range of the gradient is
        final; -1: every part still held); nothing for a part sent already."""
        if self._op is not None:
            code = lib.ps_op_send(self._op, shard)
            if code != 0:
                _raise_last(code)

    def filled(self, start):
        """A push started held whose gradient a backward pass fills in from its end: values from
        `start` to the end are final now (`start` only goes down). Each shard's part with final
        values starts already where the shard takes a push's values as they come (over the data
        plane), and goes whole once its range is final."""
        if self._op is not None:
            code = lib.ps_op_filled(self._op, int(start))
            if code != 0:
                _raise_last(code)

    def abandon(self):
        """Drops a push started held: its parts not sent yet are never sent (they end
        Cancelled); waits for those sent. The handle is done afterwards."""
        self._free()

    def done(self):
        """Whether the call has ended (its wait() then returns at once)."""
        return self._op is None or lib.ps_op_wait(self._op, 0.0) != NOT_DONE

    def wait(self, timeout=None):
        """Waits for the call (at most `timeout` seconds: then TimeoutError, the call going on)
        and returns its result: for a pull, the version each shard served; for a push, a
        PushSummary. Raises a paramserver.Error if the call failed."""
        if self._result is not None:
            return self._result
        if self._op is None:
            raise errors.Cancelled("CANCELLED", "the push was abandoned")
        if self._kind == "push":
            lib.ps_op_send(self._op, -1)  # a push started held: its parts not sent yet
        _sliced(lambda left: lib.ps_op_wait(self._op, left), timeout, self._kind)
        if self._kind == "pull":
            versions = (ctypes.c_int64 * self._num_shards)()
            code = lib.ps_op_versions(self._op, versions, self._num_shards)
            if code != 0:
                _raise_last(code)
            self._result = list(versions)
        else:
            summary = _PushSummary()
            code = lib.ps_op_push_summary(self._op, ctypes.byref(summary))
            if code != 0:
                _raise_last(code)
            self._result = PushSummary(summary.sequence, summary.max_staleness,
                                       summary.duplicates, summary.dropped, summary.saturated)
        self._free()
        return self._result

    def wait_part(self, shard, timeout=None):
        """Waits for shard `shard`'s part of the call only (at most `timeout` seconds: then
        TimeoutError), the others going on: a pull's part is then in its buffer, so a forward
        pass can start on the first layers' weights. A held push's part is sent first. Raises a
        paramserver.Error if that part failed; wait() still gives the whole call's result."""
        if self._result is not None:
            return
        if self._op is None:
            raise errors.Cancelled("CANCELLED", "the push was abandoned")
        _sliced(lambda left: lib.ps_op_wait_part(self._op, shard, left), timeout,
                     f"{self._kind}'s part of shard {shard}")

    def wait_values(self, begin, end, timeout=None):
        """Waits for a pull's values [begin, end) of its buffer only (at most `timeout` seconds:
        then TimeoutError), the rest going on: each shard's part arrives from its start, so a
        forward pass can start on a layer's weights before its shard's whole part is in. Raises
        a paramserver.Error if a part failed first. Values used so are kept: should the attempt
        that brought them fail, the pull raises Aborted rather than being tried again (compute
        again on a new pull)."""
        if self._result is not None:
            return
        if self._op is None:
            raise errors.Cancelled("CANCELLED", "the call was abandoned")
        _sliced(lambda left: lib.ps_op_wait_values(self._op, int(begin), int(end), left),
                     timeout, f"pull's values [{begin}, {end})")

    def _free(self):
        op, self._op = self._op, None
        if op is not None:
            lib.ps_op_free(op)  # waits for a call in progress: it uses the buffer
        self._owner = None

    def __del__(self):
        if getattr(self, "_op", None) is not None:
            self._free()


class OverlappedStep:
    """A training step whose pull and push overlap its compute (client/overlap_schedule.h), from
    Client.step(weights, gradient), for a framework's hooks to drive: it starts the pull of the
    step's weights into `weights`; weights_needed(begin, end) waits for a layer's weights as the
    forward pass reaches it and wait_pull() for the rest once it is over; gradient_final(begin,
    end) tells it that backward made that range of `gradient` final (the first call starts the
    push, and each shard's part goes as its range becomes final); take_push() gives the push, as
    a Handle. Should a wait raise Aborted (the pull failed after the forward pass used some of its
    values), compute the step again on a new one. One thread at a time; close() (or the
    client's) frees it, and a push not taken then sends none of its parts not sent yet."""

    def __init__(self, client, weights, gradient, prefetch):
        w, count, w_owner = float_buffer(weights, writable=True, what="the step's weights")
        g, g_count, g_owner = float_buffer(gradient, writable=False, what="the gradient")
        if g_count != count:
            raise invalid(f"the gradient has {g_count} values, the weights {count}")
        f32p = ctypes.POINTER(ctypes.c_float)
        handle = ctypes.c_void_p()
        client._call(lib.ps_client_step, ctypes.cast(w, f32p), ctypes.cast(g, f32p), count,
                     int(bool(prefetch)), ctypes.byref(handle))
        self._client, self._handle, self._owners = client, handle, (w_owner, g_owner)
        self.pulled = False  # the whole pull was waited for
        self.pushing = False  # gradient_final started a push, not taken yet

    def _call(self, fn, *args):
        if self._handle is None:
            raise errors.FailedPrecondition("FAILED_PRECONDITION", "the step is closed")
        self._client._enter()
        try:
            return fn(self._handle, *args)
        finally:
            self._client._exit()

    def _wait(self, fn, timeout, what, *args):
        self._call(lambda handle: _sliced(lambda left: fn(handle, *args, left), timeout, what))

    def weights_needed(self, begin, end, timeout=None):
        """Waits (at most `timeout` seconds: then TimeoutError) for the pull's weights
        [begin, end), a layer's, as the forward pass reaches it."""
        if not self.pulled:
            self._wait(lib.ps_step_weights_needed, timeout, f"pull's values [{begin}, {end})",
                       int(begin), int(end))

    def wait_pull(self, timeout=None):
        """Waits (at most `timeout` seconds: then TimeoutError) for the whole pull: the forward
        pass is over."""
        if not self.pulled:
            self._wait(lib.ps_step_wait_pull, timeout, "pull")
            self.pulled = True

    def gradient_final(self, begin, end):
        """Backward made the gradient [begin, end) final; the pull is waited for first."""
        self.wait_pull()
        code = self._call(lib.ps_step_gradient_final, int(begin), int(end))
        if code != 0:
            _raise_last(code)
        self.pushing = True

    def final(self, begin, end):
        """Whether any of the gradient [begin, end) was made final in this step."""
        return self._call(lib.ps_step_final, int(begin), int(end)) == 1

    @property
    def filled_from(self):
        """Where the final values reaching the gradient's end start, as the push was told
        (total_params while none do)."""
        return self._call(lib.ps_step_filled_from)

    def take_push(self):
        """The step's push, every part sent, as a Handle (gradient_final started it)."""
        op = ctypes.c_void_p()
        code = self._call(lib.ps_step_take_push, ctypes.byref(op))
        if code != 0:
            _raise_last(code)
        self.pushing = False
        return Handle(op, self._owners[1], "push", self._client.num_shards)

    def close(self):
        """Frees the step, waiting for its pull. Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            lib.ps_step_free(handle)
        self._owners = None

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            self.close()


class LocalExchange:
    """A worker's side of easgd and local SGD (client/local_exchange.h), from
    Client.local_exchange(values): trades the local model `values` (float32, total_params, which
    the caller's own optimizer trains) with the shards' centre when and as their consistency
    model says. Call before_step(step) before computing step `step` and after_step(step) after
    its local update; most steps exchange nothing, and the first before_step pulls the centre
    into `values`. Waits see Ctrl-C and signal handlers (the client's cancel() ends one with
    Cancelled). One thread at a time; close() (or the client's) frees it."""

    def __init__(self, client, values):
        address, count, owner = float_buffer(values, writable=True, what="the local model")
        handle = ctypes.c_void_p()
        client._call(lib.ps_client_exchange, ctypes.cast(address, ctypes.POINTER(ctypes.c_float)),
                     count, ctypes.byref(handle))
        self._client, self._handle, self._owner = client, handle, owner

    def before_step(self, step):
        """The exchange due before step `step` is computed (local:H: a period's start pulls the
        centre; easgd:T: every T steps, the elastic exchange); returns once it is done."""
        self._run(lib.ps_exchange_before_step, int(step))

    def after_step(self, step, last=False):
        """The exchange due after step `step`'s local update (local:H: a period's end, or
        `last`, pushes the model's change); returns once it is done."""
        self._run(lib.ps_exchange_after_step, int(step), int(bool(last)))

    def _run(self, start, *args):
        if self._handle is None:
            raise errors.FailedPrecondition("FAILED_PRECONDITION", "the exchange is closed")
        self._client._enter()
        try:
            code = start(self._handle, *args)
            if code != 0:
                _raise_last(code)
            _sliced(lambda left: lib.ps_exchange_wait(self._handle, left), None,
                    "exchange with the shards")
        finally:
            self._client._exit()

    def close(self):
        """Frees the exchange (waiting for a call in flight). Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            lib.ps_exchange_free(handle)
        self._owner = None


class Client:
    """A client of the shards. Settings are the C++ daemons' flags of the same names:

        Client(ps="h1:50051,h2:50051", model="flat:1000", rank=0, num_workers=4)
        Client(cluster="job.json", rank=2)       # shards, model, credentials from the spec

    ps: the shards in order ("a/b": a shard's two replicas); cluster: a cluster spec file;
    model: the model the shards hold: a spec (mlp:..., cnn:..., flat:N), a tensor layout (a
    dict {"tensors": [...]} as paramserver.torch.layout_of gives, or a JSON file); rank: this
    worker's rank
    (None: an observer, which may pull only); num_workers: checked against the shards';
    tls_ca, tls_cert, tls_key, token_file (else $PS_TOKEN): credentials; push_dtype,
    pull_dtype: "fp32", "bf16" or "fp16" on the wire; compress: pushes as "onebit", "topk:F"
    or "int8" instead, with error_feedback (default True); pull_compress: a worker's pulls
    too (the change since its last pull, compressed alike, over gRPC); shared_memory: use shared
    memory with shards on this host (default True); data_plane: move tensors of shards on other
    hosts over their data plane, a TCP connection beside gRPC (default True);
    rpc_timeout_seconds, heartbeat_seconds; retry_seconds: how long a failing shard is retried
    (unset: 10 s for one this client never reached, a wrong address, and 60 s for one it
    reached, which may be restarting).

    register() joins the job (a worker then sends heartbeats from a thread of its own); close()
    (or the end of a `with` block) leaves it. Calls may come from several threads; start pushes
    from one. Every failure raises a paramserver.Error carrying the shard's message. The
    library's log lines go to the logger "paramserver" (see paramserver._log).
    """

    def __init__(self, **settings):
        if isinstance(settings.get("model"), dict):
            settings["model"] = json.dumps(settings["model"])
        handle = ctypes.c_void_p()
        code = lib.ps_client_create(json.dumps(settings).encode(), ctypes.byref(handle))
        if code != 0:
            _raise_last(code)
        self._handle = handle
        self._lock = threading.Condition(threading.RLock())
        self._cancelled = False
        self._calls = 0  # blocking calls in progress on this client
        self._closed = False
        self._bound = weakref.WeakSet()  # steps and exchanges: freed before the client
        self.rank = lib.ps_client_rank(handle)
        self.total_params = lib.ps_client_total_params(handle)
        self.num_shards = lib.ps_client_num_shards(handle)
        self.shard_ranges = []  # by shard: its range (begin, end) of the flat vector
        for shard in range(self.num_shards):
            begin, end = ctypes.c_int64(), ctypes.c_int64()
            code = lib.ps_client_shard_range(handle, shard, ctypes.byref(begin),
                                             ctypes.byref(end))
            if code != 0:
                _raise_last(code)
            self.shard_ranges.append((begin.value, end.value))

    # Each call into the library holds a use of the handle, so that close() frees it only after.
    def _enter(self):
        with self._lock:
            if self._closed:
                raise errors.FailedPrecondition("FAILED_PRECONDITION", "the client is closed")
            self._calls += 1
            return self._handle

    def _exit(self):
        with self._lock:
            self._calls -= 1
            self._lock.notify_all()

    def _call(self, fn, *args):
        handle = self._enter()
        try:
            code = fn(handle, *args)
        finally:
            self._exit()
        if code != 0:
            _raise_last(code)

    def register(self):
        """Registers with every shard; returns the step to start (or, restarted, resume) at."""
        step = ctypes.c_int64()
        self._call(lib.ps_client_register, ctypes.byref(step))
        return step.value

    @property
    def consistency(self):
        """The shards' consistency model ("async", "ssp:3", "sync", ...), known after register."""
        handle = self._enter()
        try:
            return lib.ps_client_consistency(handle).decode()
        finally:
            self._exit()

    @property
    def local_models(self):
        """Whether the shards' consistency model has workers train local models (easgd, local:
        see local_exchange), known after register."""
        handle = self._enter()
        try:
            return lib.ps_client_local_models(handle) == 1
        finally:
            self._exit()

    def local_exchange(self, values):
        """The exchange of the local model `values` (float32, total_params, used in place) with
        the shards' centre under easgd and local SGD: a LocalExchange. Raises FailedPrecondition
        when the shards run no local models."""
        exchange = LocalExchange(self, values)
        self._bound.add(exchange)
        return exchange

    def step(self, weights, gradient, prefetch=False):
        """A training step whose pull (into `weights`, started now; `prefetch` as at pull_async)
        and push (of `gradient`) overlap its compute: an OverlappedStep."""
        if self._cancelled:
            raise errors.Cancelled("CANCELLED", "the client was cancelled: no step started")
        step = OverlappedStep(self, weights, gradient, prefetch)
        self._bound.add(step)
        return step

    def initialize(self, values):
        """Offers initial values to every shard; returns how many took them (shards already
        initialised keep theirs, so a restarted worker never resets a trained model)."""
        address, count, _ = float_buffer(values, writable=False, what="the initial values")
        taken = ctypes.c_int()
        self._call(lib.ps_client_initialize, ctypes.cast(address, ctypes.POINTER(ctypes.c_float)),
                   count, ctypes.byref(taken))
        return taken.value

    def _start(self, fn, kind, buffer, *args):
        if self._cancelled:
            raise errors.Cancelled("CANCELLED", f"the client was cancelled: no {kind} started")
        address, count, owner = float_buffer(buffer, writable=kind == "pull",
                                             what="the pull's buffer" if kind == "pull"
                                             else "the gradient")
        op = ctypes.c_void_p()
        self._call(fn, ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), count, *args,
                   ctypes.byref(op))
        return Handle(op, owner, kind, self.num_shards)

    def pull_async(self, out, prefetch=False):
        """Starts filling `out` (total_params float32) with the shards' weights; returns a Handle
        whose wait() gives the version each shard served. `prefetch`: the weights for this
        worker's next step, asked before this step's push has landed (async and SSP only)."""
        return self._start(lib.ps_client_pull, "pull", out, int(bool(prefetch)))

    def pull(self, out):
        """Fills `out` with the shards' weights; returns the version each shard served."""
        return self.pull_async(out).wait()

    def push_async(self, gradient, sequence=None, held=False):
        """Starts pushing `gradient` (total_params float32), computed from the weights of the last
        pull waited for; returns a Handle whose wait() gives a PushSummary. The client numbers
        pushes itself; `sequence` overrides that for a caller numbering pushes by its own steps.
        `held`: send each shard's part only at the handle's send(shard), once that shard's range
        (shard_ranges) of the gradient is final, e.g. from a backward hook."""
        return self._start(lib.ps_client_push, "push", gradient,
                           -1 if sequence is None else int(sequence), int(bool(held)))

    def push(self, gradient, sequence=None):
        """Pushes `gradient`; returns a PushSummary."""
        return self.push_async(gradient, sequence).wait()

    def stats(self):
        """Every shard's statistics (proto/ps.proto's StatsResponse), as a list of dicts, one
        per shard, keyed by the message's field names, every number a number (version,
        registered_workers, ...)."""
        text = ctypes.c_void_p()
        self._call(lib.ps_client_stats_json, ctypes.byref(text))
        try:
            return json.loads(ctypes.string_at(text.value).decode())
        finally:
            lib.ps_string_free(text)

    @property
    def cancelled(self):
        """Whether cancel() was called."""
        return self._cancelled

    def cancel(self):
        """Ends the calls in progress (their handles raise Cancelled) and refuses later pulls and
        pushes (Cancelled), without leaving: for a signal handler that wants a call blocked on
        the shards back and none started after it. close() still leaves the job."""
        with self._lock:  # re-entrant: a handler may interrupt this thread inside it
            self._cancelled = True
            if self._handle is not None:
                lib.ps_client_cancel_pending(self._handle)

    def close(self):
        """Leaves the job (a registered worker), stops heartbeats and ends calls in progress
        (their handles raise Cancelled). Idempotent; later calls raise FailedPrecondition."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._calls:
                lib.ps_client_cancel_pending(self._handle)
            while self._calls:
                self._lock.wait()
            handle, self._handle = self._handle, None
        bound = list(self._bound)
        if bound:  # one interrupted mid-call (Ctrl-C) would wait out its call when freed
            lib.ps_client_cancel_pending(handle)
        for b in bound:
            b.close()
        lib.ps_client_destroy(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            self.close()
