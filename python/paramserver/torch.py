"""The PyTorch adapter: any nn.Module trained through the parameter servers.

    model = paramserver.torch.DistributedModel(model, ps="h1:50051,h2:50051", rank=r,
                                               num_workers=4)
    for x, y in loader:
        loss_fn(model(x), y).backward()
        model.step()                      # instead of optimizer.step() and zero_grad()

The module's parameters become views into one flat float32 buffer and their gradients views into
another, so a pull writes straight into the model and a push reads straight from its gradients
(no copy). What step() does follows the shards' consistency model (ps --consistency):
  async, ssp:S  push this step's gradient and, at the same time, prefetch the next step's weights;
                the next forward pass waits for both.
  sync          push, then pull the weights of the round that push closes.
  local:H       the `optimizer` given here (the user's own) steps locally; every H steps the
                model's change since the last pull is pushed and the averaged model pulled.
  easgd:T,A     the local optimizer steps; every T steps an elastic exchange with the centre.
The optimizer of the gradient modes runs on the shards (ps --optimizer, --lr).

A worker killed and started again registers under its rank and resumes at `first_step`.
"""
import numpy as np
import torch

from . import errors, model_file
from .errors import invalid
from .client import Client


def layout_of(module):
    """The tensor layout of `module`'s parameters, the shards' --model for it (written to a JSON
    file: ps --model=F.json): {"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
    ...]}, in named_parameters() order. The shards' checkpoints and export_model then carry these
    names and shapes, so load_state_dict(load_file(exported)) restores the module."""
    return {"tensors": [{"name": name, "shape": list(p.shape)}
                        for name, p in module.named_parameters()]}


def load_file(path):
    """The tensors of a file export_model wrote, as CPU torch tensors by name (the interface of
    safetensors.torch.load_file): a module of the exported layout takes them in load_state_dict
    (strict=False when it has buffers, such as BatchNorm's running statistics, which the shards do
    not hold)."""
    return {name: torch.from_numpy(a) for name, a in model_file.load_file(path).items()}


class DistributedModel(torch.nn.Module):
    """Wraps `module` (float32 parameters on the CPU) so that it trains through the shards.

    settings: those of paramserver.Client (ps or cluster, rank, num_workers, credentials, ...);
    "model" defaults to the module's layout_of() (start the shards with the same --model).
    `client`: an existing Client instead. `initialize`: offer this module's own
    values as the initial model (default: rank 0 does). `optimizer`: the local optimizer of
    local:H and easgd (required there, unused otherwise).
    """

    def __init__(self, module, *, client=None, optimizer=None, initialize=None, **settings):
        super().__init__()
        self.module = module
        self._params = list(module.parameters())
        for name, p in module.named_parameters():
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise invalid(f"parameter {name} is {p.dtype} on {p.device}; the adapter trains "
                           "float32 parameters on the CPU")
        n = sum(p.numel() for p in self._params)
        if client is None:
            settings.setdefault("model", layout_of(module))
            client = Client(**settings)
        elif settings:
            raise invalid("pass either a client or its settings, not both")
        if client.total_params != n:
            raise invalid(f"the shards' model has {client.total_params} values; this module has "
                       f"{n} parameters")
        self.client = client
        self.optimizer = optimizer
        # One flat buffer for the weights, one for the gradients; parameters are views into them.
        self._weights = torch.empty(n)
        self._grads = torch.zeros(n)
        self._views = []
        offset = 0
        with torch.no_grad():
            for p in self._params:
                k = p.numel()
                w, g = self._weights[offset:offset + k].view_as(p), self._grads[offset:offset + k]
                w.copy_(p)
                p.data = w
                p.grad = g.view_as(p)
                self._views.append((offset, k))
                offset += k
        self.first_step = client.register()
        self.steps = self.first_step  # step() calls so far, from first_step
        kind, _, arg = client.consistency.partition(":")
        self.consistency = client.consistency
        self._local = kind in ("local", "easgd")
        if self._local:
            if optimizer is None:
                raise invalid(f"the shards run {client.consistency}: the workers train local "
                           "models; pass optimizer= (the local optimizer)")
            period, _, alpha = arg.partition(",")
            self._period = int(period)
            workers = max(1, int(settings.get("num_workers") or 1))
            self._alpha = float(alpha) if alpha else 0.9 / workers
            self._easgd = kind == "easgd"
            self._start = torch.empty(n)  # local:H: the model at the last pull
            self._centre = torch.empty(n)  # easgd: the centre pulled
        self._rounds = kind == "sync"
        if initialize is None:
            initialize = client.rank == 0
        if initialize:
            client.initialize(self._weights)
        self._pending_push = None
        self._pending_pull = None
        if self._local:
            self._exchange(first=True)
        else:
            client.pull(self._weights)
        self._hook = module.register_forward_pre_hook(lambda *_: self._ready())

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _ready(self):
        """Waits for the calls step() left in flight: the weights the forward pass reads, and the
        push that reads the gradients backward will write."""
        if self._pending_push is not None:
            push, self._pending_push = self._pending_push, None
            push.wait()
            self._grads.zero_()
        if self._pending_pull is not None:
            pull, self._pending_pull = self._pending_pull, None
            pull.wait()

    def _collect_gradients(self):
        """Brings gradients that autograd put elsewhere (after zero_grad(set_to_none=True), say)
        back into the flat buffer, and points .grad at it again."""
        for p, (offset, k) in zip(self._params, self._views):
            view = self._grads[offset:offset + k]
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.reshape(-1))
            else:
                continue
            p.grad = view.view_as(p)

    def step(self):
        """Ends this training step (after backward): see the module's docstring."""
        self._collect_gradients()
        if self._local:
            self.optimizer.step()
            self._grads.zero_()
            self.steps += 1
            if self.steps % self._period == 0:
                self._exchange()
            return
        if self._rounds:
            self.client.push(self._grads)
            self._grads.zero_()
            self.client.pull(self._weights)
        else:
            self._pending_push = self.client.push_async(self._grads)
            self._pending_pull = self.client.pull_async(self._weights, prefetch=True)
        self.steps += 1

    def _exchange(self, first=False):
        """local:H and easgd: trade the local model with the shards' centre."""
        step = self.steps
        with torch.no_grad():
            if first or not self._easgd:
                if not first:  # local: push the change since the last pull, then pull the mean
                    self.client.push(self._weights - self._start, sequence=step - 1)
                self.client.pull(self._weights)
                self._start.copy_(self._weights)
            else:  # easgd: diff = alpha (x - centre); x -= diff; the shards add diff
                self.client.pull(self._centre)
                diff = self._alpha * (self._weights - self._centre)
                self._weights.sub_(diff)
                self.client.push(diff, sequence=step)

    def close(self):
        """Waits for calls in flight, then leaves the job (the client's close)."""
        try:
            for pending in (self._pending_push, self._pending_pull):
                if pending is not None:
                    pending.wait()
        finally:
            self._pending_push = self._pending_pull = None
            self._hook.remove()
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def weights_of(module):
    """The module's parameters as one flat float32 NumPy array, in the adapter's order."""
    return np.concatenate([p.detach().reshape(-1).numpy() for p in module.parameters()])
