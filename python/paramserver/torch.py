"""The PyTorch adapter: any nn.Module trained through the parameter servers.

    model = paramserver.torch.DistributedModel(model, ps="h1:50051,h2:50051", rank=r,
                                               num_workers=4)
    for x, y in loader:
        loss_fn(model(x), y).backward()
        model.step()                      # instead of optimizer.step() and zero_grad()

A CPU module's parameters become views into one flat float32 buffer and their gradients views
into another, so a pull writes straight into the model and a push reads straight from its
gradients (no copy). A module on a GPU keeps its own parameters (all on one device, float32;
autocast may compute in bf16 on them), and the flat buffers are pinned host memory: backward's
gradients are copied out in buckets on a side stream, each shard's part pushed once its copies
have landed, and each layer's weights are copied in once the pull brought them, before the
forward pass reaches the layer (staging.py; staging=True takes this path for a CPU module).
One worker process per GPU: local_device() is the one $LOCAL_RANK names, as torchrun and
launch --gpus set it:

    model = paramserver.torch.DistributedModel(Net().cuda(paramserver.torch.local_device()), ...)

What happens follows the shards' consistency model (ps --consistency):
  async, ssp:S, sync
                the gradient is pushed while backward runs: each shard's part as soon as backward
                has produced every gradient in its range (the last layers first, as DDP's
                buckets), the rest at step(), which also starts the pull of the next step's
                weights (under sync the shards answer it once the round closes); the next forward
                pass waits for the push, and for each layer's weights as it reaches that layer
                (the first layers' shards first). Backward more than once per step (accumulating
                gradients): run all but the last inside `with model.no_sync():`, as with DDP. No
                zero_grad() is needed: each step's gradients start at zero.
  local:H       the `optimizer` given here (the user's own) steps locally; every H steps the
                model's change since the last pull is pushed and the averaged model pulled.
  easgd:T,A     the local optimizer steps; every T steps an elastic exchange with the centre.
                (Both exchanges are the C++ worker's: Client.local_exchange.)
The optimizer of the gradient modes runs on the shards (ps --optimizer, --lr).

Buffers (BatchNorm's running statistics) travel with the parameters, as DDP broadcasts them: the
shards hold them untrained (layout_of marks them), each push carries the worker's (the shards keep
the last, or under sync and local:H the round's average), each pull brings them back into the
module before the forward pass reaches it, and export_model and evaluate() carry them.

A worker killed and started again registers under its rank and resumes at `first_step`.

Started by `launch --worker_cmd` (or `experiment`), a worker finds the shards, its rank and its
credentials in its environment (PS_PS, PS_RANK, PS_TOKEN_FILE, ...: settings_from_environment),
records its steps where the launcher counts them (PS_CSV) and computes as slowly as a straggler
plan asks (PS_SLOWDOWN), with no change to the training script. evaluate() is the evaluator's
side: the user's own scoring code run on the shards' weights.
"""
import contextlib
import csv as csv_module
import functools
import os
import signal
import threading
import time

import torch

from . import errors, model_file
from . import staging as staging_module
from .errors import invalid
from .client import Client, settings_from_environment


def layout_of(module):
    """The tensor layout of `module`'s state, the shards' --model for it (written to a JSON file:
    ps --model=F.json): {"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]}, ...,
    {"name": "bn1.running_mean", "shape": [16], "buffer": true}, ...]}: its parameters in
    named_parameters() order, then the buffers its state_dict holds (BatchNorm's running
    statistics), which the shards hold untrained. The shards' checkpoints and export_model then
    carry these names and shapes, so load_state_dict(load_file(exported)) restores the module."""
    return {"tensors": [{"name": name, "shape": list(p.shape)}
                        for name, p in module.named_parameters()] +
                       [{"name": name, "shape": list(b.shape), "buffer": True}
                        for name, b in _buffers_of(module)]}


def load_file(path):
    """The tensors of a file export_model wrote, as CPU torch tensors by name (the interface of
    safetensors.torch.load_file): a module of the exported layout takes them in load_state_dict,
    buffers included (an integer buffer, such as BatchNorm's num_batches_tracked, takes its value
    from the file's float32)."""
    return {name: torch.from_numpy(a) for name, a in model_file.load_file(path).items()}


class DistributedModel(torch.nn.Module):
    """Wraps `module` (float32 parameters, all on the CPU or all on one CUDA device) so that it
    trains through the shards; a parameter of another type, or on another device than the
    first's, is refused (InvalidArgument, naming it and both devices).

    settings: those of paramserver.Client (ps or cluster, rank, num_workers, credentials, ...);
    without "ps" or "cluster", those of the environment (settings_from_environment). "model"
    defaults to the module's layout_of() (start the shards with the same --model).
    `client`: an existing Client instead. `initialize`: offer this module's own
    values as the initial model (default: rank 0 does). `optimizer`: the local optimizer of
    local:H and easgd (required there, unused otherwise). `csv`: append a row per step here
    (step,wall_time,loss; default $PS_CSV). `slowdown`: compute this many times slower, sleeping
    in step() (a straggler; default $PS_SLOWDOWN, else 1). `overlap`: push during backward and
    wait for each layer's weights as the forward pass reaches it (default; should the pull fail
    after the pass used some of its weights, the pass runs again on a new pull, and what it did
    besides, such as BatchNorm's running statistics, it then did twice); False pushes the whole
    gradient at step() and waits for all weights before the forward pass (needed by a module that
    reads another's parameters without calling it: see _ForwardPull). `staging`: train a CPU
    module through the copy path a GPU module takes (its own parameters, copied from and to the
    flat buffers; staging.py), as tests do where there is no GPU. A module on a GPU, or staged,
    trains under async, SSP and sync (local:H and easgd: CPU modules only, for now).
    """

    def __init__(self, module, *, client=None, optimizer=None, initialize=None, csv=None,
                 slowdown=None, overlap=True, staging=False, **settings):
        super().__init__()
        self.module = module
        self._params = list(module.parameters())
        device = _device_of(module)
        self._views = _offsets(self._params)  # by parameter: (offset, count) in the buffers
        # The module's buffers (BatchNorm's running statistics; "_buffers" is nn.Module's own).
        self._stats = _Buffers(module, sum(p.numel() for p in self._params))
        n = self._stats.end  # the parameters', then the buffers' values
        self.slowdown = float(os.environ.get("PS_SLOWDOWN", 1) if slowdown is None
                              else slowdown)
        if not self.slowdown >= 1:
            raise invalid(f"slowdown must be >= 1, not {self.slowdown}")
        if self._stats.end > self._stats.offset and settings.get("compress"):
            raise invalid("a module with buffers (BatchNorm's running statistics) pushes their "
                          "values, which compression would garble: train it without compress")
        if client is None:
            if "ps" not in settings and "cluster" not in settings:
                settings = {**settings_from_environment(), **settings}
            if "model" not in settings and "hidden" not in settings:
                settings["model"] = layout_of(module)
            client = Client(**settings)
        elif settings:
            raise invalid("pass either a client or its settings, not both")
        if client.total_params != n:
            raise invalid(f"the shards' model has {client.total_params} values; this module has "
                       f"{n} (parameters and buffers: start the shards with its layout_of)")
        self.client = client
        self.optimizer = optimizer
        layers = _layers(self)
        # The flat buffers the steps pull into and push from: the parameters' own memory on the
        # CPU, else host buffers the parameters are copied from and to (staging.py).
        if device.type == "cpu" and not staging:
            self._home = _Views(self._params, self._views, n)
        else:
            self._home = staging_module.StagedParameters(self._params, self._views, n, layers,
                                                         staging_module.copies_for(device))
        self._weights, self._grads = self._home.weights, self._home.grads
        self._stats.write(self._weights)  # (the initial model, if this worker offers it)
        self.first_step = client.register()
        self.steps = self.first_step  # step() calls so far, from first_step
        self.consistency = client.consistency
        local = client.local_models
        if local and optimizer is None:
            raise invalid(f"the shards run {client.consistency}: the workers train local "
                          "models; pass optimizer= (the local optimizer)")
        if local and not isinstance(self._home, _Views):
            raise invalid(f"the shards run {client.consistency}: local models train on the CPU, "
                          f"without staging (this module is on {device})")
        if initialize is None:
            initialize = client.rank == 0
        if initialize:
            client.initialize(self._weights)
        self._pending_push = None
        self._exchange = None  # local:H and easgd: the local model's exchange with the centre
        self._step = None  # the others: this step's pull and push (Client.step)
        if local:
            self._exchange = client.local_exchange(self._weights)
            self._exchange.before_step(self.steps)  # the first pulls the centre
            self._stats.read(self._weights)
        else:
            self._new_step(prefetch=False)
            self._finish_pull()
        self._overlap = overlap and not local
        self._hooks = [module.register_forward_pre_hook(lambda *_: self._ready())]
        self._backward = None
        if self._overlap:
            self._backward = _BackwardPush(self)
            self._hooks += self._backward.hooks + _ForwardPull(self, layers).hooks
        self._csv = _StepLog(csv if csv is not None else os.environ.get("PS_CSV"))
        self._compute_start = time.monotonic()

    def forward(self, *args, **kwargs):
        try:
            out = self.module(*args, **kwargs)
            self._finish_pull()  # the parameters this pass did not use
        except errors.Aborted:
            # The pull failed under weights this pass had used (a retry would have rewritten
            # them): once more, on a new pull. (What the first pass did besides, such as
            # BatchNorm's running statistics, it did twice.)
            self._new_step(prefetch=False).wait_pull()
            out = self.module(*args, **kwargs)
        return out

    def zero_grad(self, set_to_none=True):
        """Clears the gradients for a fresh start after a backward that no step() followed (one
        that raised midway, say): what it began to push is dropped (parts not sent yet are never
        sent). A CPU module's gradients stay views into the flat buffer, zeroed, whatever
        `set_to_none`; a GPU module's (or a staged one's) are set to None.
        Not needed in a plain loop: step() starts each step's gradients at zero."""
        try:
            self._home.drain()
        except errors.Error:
            pass  # the push it began is dropped below
        dropped = self._step is not None and self._step.pushing
        if dropped:
            self._step.close()  # its parts not sent yet are never sent
        self._wait_push()
        self._home.zero_grad()
        if dropped:
            # Parts of it may have reached shards: the next step computes on their weights now.
            self._new_step(prefetch=False)

    def _wait_push(self):
        """Waits for the push step() left in flight, then zeroes the gradients it read."""
        if self._pending_push is not None:
            push, self._pending_push = self._pending_push, None
            push.wait()
            self._home.pushed()

    def _ready(self):
        """Waits for the calls step() left in flight: the push that reads the gradients backward
        will write, and the weights the forward pass reads (all of them, or with overlap each
        layer's own as the pass reaches it: _ForwardPull)."""
        self._home.drain()  # (a backward that no step() followed)
        self._wait_push()
        if not self._overlap:
            self._finish_pull()
        self._compute_start = time.monotonic()

    def _finish_pull(self):
        """Waits for the rest of this step's pull (and copies in the weights no layer did).
        Before a push starts: its base (the versions staleness is counted from) is the last pull
        waited for whole."""
        if self._step is not None:
            self._step.wait_pull()
            self._home.all_weights_in()
            self._stats.read(self._weights)

    def _new_step(self, prefetch):
        """Frees this step (waiting for its pull's end) and starts the next: its pull, into the
        weights, and the push of its gradient to come. Returns it."""
        if self._step is not None:
            self._step.close()  # (kept, closed, should the new one not start: its calls raise)
        self._home.new_pull()
        self._stats.new_pull()
        self._step = self.client.step(self._weights, self._grads, prefetch)
        return self._step

    def step(self, loss=None):
        """Ends this training step (after backward): see the module's docstring. `loss` (a
        number or a one-element tensor), if given, goes to the step's CSV row."""
        if self.slowdown > 1:  # a cancel() meanwhile makes the push below raise Cancelled
            time.sleep((self.slowdown - 1) * (time.monotonic() - self._compute_start))
        self._csv.row(self.steps, f"{time.time():.3f}",
                      "" if loss is None else f"{float(loss):.5f}")
        if self._exchange is not None:
            self._home.collect()
            self.optimizer.step()
            self._grads.zero_()
            self._stats.write(self._weights)
            self._exchange.after_step(self.steps)
            self.steps += 1
            self._stats.new_pull()
            self._exchange.before_step(self.steps)
            self._stats.read(self._weights)
            return
        # Every gradient is final now (those no backward hook sent: overlap off, no_sync, unused).
        self._home.collect()
        self._stats.write(self._grads)  # their values as this step's forward passes left them
        self._step.gradient_final(0, len(self._grads))
        self._pending_push = self._step.take_push()
        self._new_step(prefetch=True)
        self.steps += 1

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate their gradients without pushing (DDP's no_sync):
        the next backward outside, or step(), pushes the sum."""
        if self._backward is None:
            yield
            return
        self._backward.paused = True
        try:
            yield
        finally:
            self._backward.paused = False

    def close(self):
        """Waits for calls in flight, then leaves the job (the client's close)."""
        try:
            for wait in (self._home.drain, self._wait_push, self._finish_pull):
                try:
                    wait()
                except errors.Error:
                    if not self.client.cancelled:
                        raise
                    # cancelled first (a shutdown): the call's end is all there is to wait for
        finally:
            self._pending_push = None
            if self._step is not None:
                self._step.close()  # a push backward began and no step() took: not sent
            for hook in self._hooks:
                hook.remove()
            self._hooks = []
            self._csv.close()
            self._home.close()
            if self._exchange is not None:
                self._exchange.close()
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _BackwardPush:
    """Maps a DistributedModel's backward pass onto its step (Client.step's OverlappedStep): a
    hook on each parameter's gradient accumulation tells the step that the parameter's range of
    the gradient is final, and the step sends each shard its part of the push as that range
    becomes final (and, over the data plane, piece by piece as the final values reaching the end
    grow). Frozen parameters' ranges are final from the start; parameters that get no gradient
    (unused) hold their shards' parts until step()."""

    def __init__(self, model):
        self._model = model
        self.paused = False  # no_sync
        self.hooks = []
        for i, p in enumerate(model._params):
            if p.requires_grad:
                self.hooks.append(p.register_hook(self._check_hook(i)))
                self.hooks.append(_after_accumulate(p, lambda i=i: self._accumulated(i)))

    def _check_hook(self, index):
        """Runs before parameter `index`'s gradient is accumulated: refuses a second backward
        that would write into the gradient this step is pushing."""
        def check(_):
            if self._model._home.taken(index, self._model._step):
                raise RuntimeError(
                    "paramserver: backward ran twice in one step while its gradient was being "
                    "pushed; run the passes that only accumulate inside `with model.no_sync():` "
                    "(or call model.zero_grad() to start the step again)")
        return check

    def _accumulated(self, index):
        """Parameter `index` has its gradient for this step."""
        if not self.paused:
            model = self._model
            model._home.gradient_made(index, functools.partial(_tell, model, model._step))


def _tell(model, step, begin, end):
    """Tells `step` that backward made the gradient [begin, end) final; the first time, frozen
    parameters' ranges too (their gradients stay zero)."""
    if not step.pushing:
        for p, (offset, k) in zip(model._params, model._views):
            if not p.requires_grad:
                step.gradient_final(offset, offset + k)
    step.gradient_final(begin, end)


class _ForwardPull:
    """Maps a DistributedModel's forward pass onto its step: a pre-hook on each module that holds
    parameters of its own (_layers) waits for the values of all the parameters under it
    (OverlappedStep.weights_needed; nn.MultiheadAttention reads its out_proj's weights without
    calling it), the first layers' while the later layers' are still arriving, and has them
    copied in where the module's parameters are not the buffer's views. A module whose forward
    reads the parameters of a module it does not contain, without calling it, needs
    overlap=False."""

    def __init__(self, model, layers):
        self._model = model
        self.hooks = [m.register_forward_pre_hook(lambda *_, layer=layer: self._wait(layer))
                      for layer, (m, _, _) in enumerate(layers)]
        self._spans = [spans for _, _, spans in layers]
        self._buffer_indices = [model._stats.indices(m) for m, _, _ in layers]

    def _wait(self, layer):
        step = self._model._step
        for begin, end in self._spans[layer]:
            step.weights_needed(begin, end)
        self._model._home.weights_in(step, layer)
        self._model._stats.read(self._model._weights, self._buffer_indices[layer])


def _layers(model):
    """The modules of `model` that hold parameters or buffers (_Buffers) of their own, in
    modules() order, each as (module, the indices of all the parameters under it, by shard the
    span of the values of all its parameters and buffers there: a shard's part arrives from its
    start)."""
    ranges = model.client.shard_ranges
    index = {id(p): i for i, p in enumerate(model._params)}
    layers = []
    for m in model.module.modules():
        if (next(m.parameters(recurse=False), None) is None and
                not model._stats.indices(m, recurse=False)):
            continue
        indices = [index[id(p)] for p in m.parameters()]
        spans = {}
        for offset, end in ([(model._views[i][0], sum(model._views[i])) for i in indices] +
                            model._stats.spans(model._stats.indices(m))):
            k = end - offset
            for s, (begin, end) in enumerate(ranges):
                lo, hi = max(begin, offset), min(end, offset + k)
                if lo < hi:
                    old = spans.get(s, (lo, hi))
                    spans[s] = (min(old[0], lo), max(old[1], hi))
        layers.append((m, indices, [spans[s] for s in sorted(spans)]))
    return layers


class _Views:
    """The parameters of a CPU module as views into the flat buffers (`weights`, `grads`): a pull
    writes the module's weights and a push reads its gradients, no copy. The DistributedModel's
    parameters' home, as staging.StagedParameters is for the copy path (the same methods)."""

    def __init__(self, params, views, n):
        self._params, self._views = params, views
        self.weights = _flat_weights(params, views, n)
        self.grads = torch.zeros(n)
        self.zero_grad()

    def taken(self, index, step):
        offset, k = self._views[index]
        return step.final(offset, offset + k)

    def _collect(self, index):
        """Brings parameter `index`'s gradient, if autograd put it elsewhere (after
        zero_grad(set_to_none=True), say), back into the flat buffer, and points .grad at it."""
        p, (offset, k) = self._params[index], self._views[index]
        view = self.grads[offset:offset + k]
        if p.grad is None:
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad.reshape(-1))
        else:
            return
        p.grad = view.view_as(p)

    def gradient_made(self, index, tell):
        self._collect(index)
        offset, k = self._views[index]
        tell(offset, offset + k)

    def collect(self):
        for index in range(len(self._params)):
            self._collect(index)

    def pushed(self):
        self.grads.zero_()

    def zero_grad(self):
        self.grads.zero_()
        for p, (offset, k) in zip(self._params, self._views):
            p.grad = self.grads[offset:offset + k].view_as(p)

    def drain(self):
        pass

    def weights_in(self, step, layer):
        pass

    def all_weights_in(self):
        pass

    def new_pull(self):
        pass

    def close(self):
        pass


class _Buffers:
    """The module's buffers that its state_dict holds (BatchNorm's running statistics and batch
    count): on the shards after all parameters (layout_of marks them), held there untrained. They
    are copied, never viewed (num_batches_tracked is an integer; the flat buffers are float32):
    into the push at step() (the shards keep each push's values; a sync round keeps their
    average), and from each pull into the module before the forward pass reaches the module that
    holds them, once per step (a module called twice in one pass keeps what its first call did)."""

    def __init__(self, module, offset):
        self.offset = offset
        self._tensors = []  # (name, buffer, offset)
        for name, b in _buffers_of(module):
            self._tensors.append((name, b, offset))
            offset += b.numel()
        self.end = offset
        self._index = {id(b): i for i, (_, b, _) in enumerate(self._tensors)}
        self._in = [False] * len(self._tensors)

    def indices(self, module, recurse=True):
        """The buffers under `module` (or its own only), by index."""
        return [self._index[id(b)] for b in module.buffers(recurse=recurse) if id(b) in self._index]

    def spans(self, indices):
        return [(self._tensors[i][2], self._tensors[i][2] + self._tensors[i][1].numel())
                for i in indices]

    def write(self, flat):
        """Copies the module's buffers into their place in `flat` (a push's gradient or, under
        local models, the weights the exchange pushes from)."""
        with torch.no_grad():
            for _, b, offset in self._tensors:
                flat[offset:offset + b.numel()].copy_(b.reshape(-1))

    def new_pull(self):
        """A new pull is about to bring the shards' buffers."""
        self._in = [False] * len(self._tensors)

    def read(self, flat, indices=None):
        """Copies the pulled values of the buffers `indices` (default: all) that this pull has not
        copied in yet from `flat` into the module."""
        with torch.no_grad():
            for i in range(len(self._tensors)) if indices is None else indices:
                if not self._in[i]:
                    _, b, offset = self._tensors[i]
                    b.copy_(flat[offset:offset + b.numel()].view_as(b))
                    self._in[i] = True


def _buffers_of(module):
    """`module`'s buffers that its state_dict holds (persistent ones), as (name, tensor), in
    named_buffers() order; refuses a buffer that is not a real number."""
    kept = module.state_dict(keep_vars=True)
    buffers = [(name, b) for name, b in module.named_buffers() if name in kept]
    for name, b in buffers:
        if b.is_complex():
            raise invalid(f"buffer {name} is {b.dtype}: the shards hold real numbers")
    return buffers


def _device_of(module):
    """The one device `module`'s parameters are on (the CPU without any): refuses parameters that
    are not float32, on different devices, or on a device other than the CPU or a GPU."""
    first = None
    for name, p in module.named_parameters():
        if p.dtype != torch.float32:
            raise invalid(f"parameter {name} is {p.dtype}; the adapter trains float32 parameters "
                          "(autocast may compute in lower precision on them)")
        if first is None:
            first = (name, p.device)
        elif p.device != first[1]:
            raise invalid(f"parameter {name} is on {p.device}, parameter {first[0]} on "
                          f"{first[1]}: the adapter trains a module on one device")
    device = torch.device("cpu") if first is None else first[1]
    if device.type not in ("cpu", "cuda"):
        raise invalid(f"the module's parameters are on {device}; the adapter trains them on the "
                      "CPU or a CUDA device")
    return device


def local_device():
    """The GPU this worker process trains on, as torchrun and launch --gpus say it: cuda:N with N
    = $LOCAL_RANK (0 without it) modulo the GPUs this process sees (launch --gpus shows each
    worker its GPU alone, as its cuda:0); the CPU where CUDA is not available. Move the module
    there before wrapping it: module.cuda(paramserver.torch.local_device())."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())


def _after_accumulate(param, fn):
    """Calls fn() each time backward has accumulated `param`'s gradient into param.grad; returns
    a handle whose remove() undoes it."""
    if hasattr(param, "register_post_accumulate_grad_hook"):  # torch >= 2.1
        return param.register_post_accumulate_grad_hook(lambda _: fn())
    # Older torch: a hook run after the parameter's AccumulateGrad node, as Horovod does.
    with torch.enable_grad():
        node = param.expand_as(param).grad_fn.next_functions[0][0]
    handle = node.register_hook(lambda *_: fn())
    return _NodeHook(node, handle)


class _NodeHook:
    """A hook on an AccumulateGrad node, which must be kept alive for the hook to stay."""

    def __init__(self, node, handle):
        self._node = node
        self._handle = handle

    def remove(self):
        self._handle.remove()
        self._node = None


class _StepLog:
    """Rows appended to a CSV file (nothing when `path` is empty), with a header
    when the file is new; flushed per row, so that a launcher reading it sees progress."""

    def __init__(self, path, columns=("step", "wall_time", "loss")):
        self._file = None
        if path:
            new = not os.path.exists(path) or os.path.getsize(path) == 0
            self._file = open(path, "a", newline="")
            self._writer = csv_module.writer(self._file)
            if new:
                self._writer.writerow(columns)

    def row(self, *values):
        if self._file is not None:
            self._writer.writerow(values)
            self._file.flush()

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


def evaluate(module, score, *, interval_seconds=None, csv=None, **settings):
    """The evaluator of a model only your code can score: pulls the shards' weights into
    `module`'s parameters and buffers (as an observer; the module on any device) and calls
    score(module) -> (loss, accuracy) whenever
    they changed, at most every `interval_seconds` (default $PS_INTERVAL_SECONDS, else 2), until
    SIGTERM or SIGINT; then once more, so that the last row is the run's result. Appends
    wall_time,version,test_loss,test_accuracy rows (version: the lowest of the shards') to `csv`
    (default $PS_CSV), the evaluator daemon's columns, which launch and experiment read. settings:
    as DistributedModel's (the environment's without "ps" or "cluster"). Returns the last
    (version, loss, accuracy), or None if the shards were never initialised. Call it from the
    main thread (it handles the signals)."""
    if "ps" not in settings and "cluster" not in settings:
        environment = settings_from_environment()
        environment.pop("rank", None)
        settings = {**environment, **settings}
    if "model" not in settings and "hidden" not in settings:
        settings["model"] = layout_of(module)
    settings["rank"] = None
    if interval_seconds is None:
        interval_seconds = float(os.environ.get("PS_INTERVAL_SECONDS", 2))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    log = _StepLog(csv if csv is not None else os.environ.get("PS_CSV"),
                   ("wall_time", "version", "test_loss", "test_accuracy"))
    last = None
    try:
        with Client(**settings) as client:
            client.register()
            weights = torch.zeros(client.total_params)  # copied into the module (on any device)
            while True:
                stopping = stop.is_set()
                pull = client.pull_async(weights)
                while not pull.done() and not stop.is_set():
                    stop.wait(0.1)
                if stop.is_set() and not pull.done():
                    # The shards are slow or gone: the final pull gets a few seconds, no more.
                    try:
                        pull.wait(timeout=5)
                    except (errors.Error, TimeoutError):
                        client.cancel()
                        break
                version = min(pull.wait())
                if last is None or version != last[0]:
                    set_weights(module, weights)
                    loss, accuracy = score(module)
                    last = (version, float(loss), float(accuracy))
                    log.row(f"{time.time():.3f}", version, f"{last[1]:.5f}", f"{last[2]:.4f}")
                    print(f"version {version}: test loss {last[1]:.4f}, accuracy "
                          f"{last[2]:.4f}", flush=True)
                if stopping:
                    break
                stop.wait(interval_seconds)
    finally:
        log.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return last


def _offsets(params):
    """Where each of `params` lies in the flat buffers: (offset, count), in layout order."""
    views = []
    for p in params:
        views.append((sum(views[-1]) if views else 0, p.numel()))
    return views


def _flat_weights(params, views, n):
    """Points `params` into one flat float32 buffer of `n` values at `views` (_offsets), their
    values kept, and returns it: a pull into it writes the module's weights."""
    weights = torch.zeros(n)
    with torch.no_grad():
        for p, (offset, k) in zip(params, views):
            weights[offset:offset + k].copy_(p.detach().reshape(-1))
            p.data = weights[offset:offset + k].view_as(p)
    return weights


def weights_of(module):
    """The module's parameters, then its buffers (layout_of's order: the shards' flat vector), as
    one flat float32 NumPy array."""
    params = [p.detach().reshape(-1).cpu() for p in module.parameters()]
    buffers = _Buffers(module, sum(p.numel() for p in params))
    flat = torch.cat(params + [torch.zeros(buffers.end - buffers.offset)])
    buffers.write(flat)
    return flat.numpy()


def set_weights(module, flat):
    """Copies `flat` (a float32 tensor in layout_of's order, e.g. a pull) into the module's
    parameters and buffers; the inverse of weights_of."""
    with torch.no_grad():
        offset = 0
        for p in module.parameters():
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        _Buffers(module, offset).read(flat)
