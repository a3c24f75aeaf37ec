"""The PyTorch adapter's copy path (paramserver.torch.DistributedModel): a module whose parameters
are its own tensors, on a GPU (or on the CPU with staging=True), trained through flat host
buffers that the step pulls into and pushes from, as BytePS stages a GPU worker's tensors.

Backward: the gradients are copied to the host in buckets (last layers first, as DDP's buckets), a
bucket's copy issued once backward has produced all of its gradients; a thread waits for each copy
to land and then tells the step that its range is final, so that each shard's part goes as soon as
its copies are in, while backward goes on. Forward: each layer's weights are copied to the device
once the pull brought them (the layers whose weights are in already are copied ahead) and the
forward pass waits for that copy only. What differs between a GPU and the CPU is one small object,
the copies (CudaCopies, HostCopies): the rest is this file's one implementation.
"""
import queue
import threading

import torch

# Gradients per bucket: 256 KiB of float32, a quarter of DDP's first bucket, so that the last
# layers' shards get their parts while backward is still on the first layers of a small model.
BUCKET_VALUES = 1 << 16


class HostCopies:
    """Copies on the CPU (staging=True): plain memory copies, done when issued."""

    def host_buffer(self, n):
        return torch.zeros(n)

    def to_host(self, pairs):
        """Copies each (host, gradient) pair's gradient into its host slice; returns an event."""
        for host, grad in pairs:
            host.copy_(grad.reshape(-1))

    def landed(self, event):
        """Returns once the copy of to_host's `event` is in host memory."""

    def to_device(self, pairs):
        """Copies each (parameter, host) pair's host slice into the parameter; returns an event."""
        with torch.no_grad():
            for param, host in pairs:
                param.copy_(host.view_as(param))

    def compute_waits(self, event):
        """Orders the compute that follows after the to_device copy of `event`."""

    def new_pull(self):
        """A pull is about to write the host weights and the next copies the parameters."""


class CudaCopies:
    """Copies between CUDA device `device` and pinned host memory, on two side streams (one each
    way) ordered against the compute stream (the current stream) by events, never by blocking the
    host; landed() is the only wait, on the thread that tells the step."""

    def __init__(self, device):
        self._device = device
        self._to_host = torch.cuda.Stream(device)
        self._to_device = torch.cuda.Stream(device)

    def _compute(self):
        return torch.cuda.current_stream(self._device)

    def host_buffer(self, n):
        return torch.zeros(n, pin_memory=True)

    def to_host(self, pairs):
        self._to_host.wait_event(self._compute().record_event())  # after the gradients are made
        with torch.cuda.stream(self._to_host):
            for host, grad in pairs:
                host.copy_(grad.reshape(-1), non_blocking=True)
        return self._to_host.record_event()

    def landed(self, event):
        event.synchronize()

    def to_device(self, pairs):
        with torch.cuda.stream(self._to_device), torch.no_grad():
            for param, host in pairs:
                param.copy_(host.view_as(param), non_blocking=True)
        return self._to_device.record_event()

    def compute_waits(self, event):
        self._compute().wait_event(event)

    def new_pull(self):
        # The last step's copies to the device have read the host weights the pull rewrites, and
        # the next ones write the parameters after the compute issued so far has read them.
        self._to_device.synchronize()
        self._to_device.wait_stream(self._compute())


def copies_for(device):
    """The copies of a module on `device` (the CPU or a CUDA device)."""
    return CudaCopies(device) if device.type == "cuda" else HostCopies()


class StagedParameters:
    """The flat host buffers (`weights`, `grads`, of `n` values: the parameters', then room for
    the module's buffers, which the DistributedModel copies itself) of a module whose parameters
    stay its own tensors, and the copies between them; the DistributedModel calls it as its
    parameters' home (the interface paramserver.torch._Views shares). Its landing thread calls the step's
    gradient_final while backward runs: drain() before any other call on the step."""

    def __init__(self, params, views, n, layers, copies):
        self._params, self._views, self._copies = params, views, copies
        self._layers = [indices for _, indices, _ in layers]
        self._spans = [spans for _, _, spans in layers]
        self.weights = copies.host_buffer(n)
        with torch.no_grad():
            for p, (offset, k) in zip(params, views):
                self.weights[offset:offset + k].copy_(p.detach().reshape(-1))
        self.grads = copies.host_buffer(n)
        self._buckets = _buckets(params, views)
        self._bucket_of = {i: b for b, bucket in enumerate(self._buckets) for i in bucket}
        self._landing = _Landing(copies)
        self._reset()

    def _reset(self):
        """A new step: no gradient copied out, no weight copied in."""
        self._copied = set()  # parameters whose gradient this step copied (or is copying) out
        self._missing = [len(bucket) for bucket in self._buckets]  # by bucket: still to come
        self._fresh = {}  # parameter -> (order, event) of the copy in of this step's weights
        self._ahead = 0  # the first layer whose weights may not be copied in yet

    def _host(self, buffer, index):
        offset, k = self._views[index]
        return buffer[offset:offset + k]

    def taken(self, index, step):
        """Whether this step took parameter `index`'s gradient already."""
        return index in self._copied

    def gradient_made(self, index, tell):
        """Backward produced parameter `index`'s gradient: once its bucket is whole, copies the
        bucket out, and tell(begin, end) is called on the landing thread once it is in."""
        bucket = self._bucket_of.get(index)
        if bucket is None or index in self._copied:
            return
        self._copied.add(index)
        self._missing[bucket] -= 1
        if self._missing[bucket] == 0:
            indices = self._buckets[bucket]
            grads = [self._params[i].grad for i in indices]
            event = self._copies.to_host(
                [(self._host(self.grads, i), g) for i, g in zip(indices, grads)])
            begin = self._views[indices[-1]][0]
            end = sum(self._views[indices[0]])
            self._landing.put(event, lambda: tell(begin, end), grads)

    def collect(self):
        """Every gradient this step did not copy out yet (backward made none: unused, frozen,
        no_sync) in the host buffer, every copy landed and told; the module's gradients are
        cleared for the next step (each step's gradients start at zero)."""
        pairs = []
        for i, p in enumerate(self._params):
            if i in self._copied:
                continue
            if p.grad is None:
                self._host(self.grads, i).zero_()
            else:
                pairs.append((self._host(self.grads, i), p.grad))
        self._copied.update(range(len(self._params)))
        event = self._copies.to_host(pairs) if pairs else None
        self._landing.drain()
        if event is not None:
            self._copies.landed(event)
        for p in self._params:
            p.grad = None

    def pushed(self):
        """The step's push ended (the host gradients are overwritten whole by the next step)."""

    def zero_grad(self):
        """Drops this step's gradients. REQUIRES: drained."""
        for p in self._params:
            p.grad = None
        self._copied = set()
        self._missing = [len(bucket) for bucket in self._buckets]

    def drain(self):
        """Waits until every gradient copy issued has landed and been told; raises the error of
        a tell that failed."""
        self._landing.drain()

    def _copy_in(self, indices):
        """Copies the parameters `indices` not copied in yet this step; returns the event of the
        last copy that wrote any of them (None: nothing to wait for)."""
        pairs = [(self._params[i], self._host(self.weights, i))
                 for i in indices if i not in self._fresh]
        if pairs:
            event = self._copies.to_device(pairs)
            for i in indices:
                self._fresh.setdefault(i, (len(self._fresh), event))
        return max((self._fresh[i] for i in indices), key=lambda f: f[0], default=(0, None))[1]

    def weights_in(self, step, layer):
        """The pull brought layer `layer`'s weights (waited for): copies them in, and the layers
        after it whose weights are in too, and makes the compute wait for the layer's copy."""
        event = self._copy_in(self._layers[layer])
        self._ahead = max(self._ahead, layer + 1)
        while self._ahead < len(self._layers):
            try:
                for begin, end in self._spans[self._ahead]:
                    step.weights_needed(begin, end, timeout=0)
            except TimeoutError:
                break
            self._copy_in(self._layers[self._ahead])
            self._ahead += 1
        if event is not None:  # (a layer of buffers only has no parameter to copy)
            self._copies.compute_waits(event)

    def all_weights_in(self):
        """The whole pull is in: copies in the weights no layer copied."""
        event = self._copy_in(range(len(self._params)))
        if event is not None:
            self._copies.compute_waits(event)

    def new_pull(self):
        """A new step's pull is about to write the host weights."""
        self._landing.drain()
        self._copies.new_pull()
        self._reset()

    def close(self):
        self._landing.close()


def _buckets(params, views):
    """Parameters that take gradients, grouped last first into runs of adjacent parameters of
    about BUCKET_VALUES values (a bucket is one range of the gradient)."""
    buckets, bucket, size = [], [], 0
    for i in reversed(range(len(params))):
        if not params[i].requires_grad:
            bucket, size = [], 0
            continue
        if not bucket:
            buckets.append(bucket)
        bucket.append(i)
        size += views[i][1]
        if size >= BUCKET_VALUES:
            bucket, size = [], 0
    return buckets


class _Landing:
    """A thread that waits for each gradient copy to land, in the order issued, and then calls
    its tell() (the step's gradient_final); the first error stops the tells and is kept for
    drain()."""

    def __init__(self, copies):
        self._copies = copies
        self._queue = queue.Queue()
        self._error = None
        self._thread = None  # started by the first put

    def put(self, event, tell, keep):
        """`keep`: what the copy reads, held until it landed."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="paramserver-landing",
                                            daemon=True)
            self._thread.start()
        self._queue.put((event, tell, keep))

    def _run(self):
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                event, tell, _ = item
                if self._error is None:
                    self._copies.landed(event)
                    tell()
            except BaseException as e:  # raised by drain() on the training thread
                self._error = e
            finally:
                self._queue.task_done()

    def drain(self):
        self._queue.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
