"""The PyTorch adapter against real shards: Python workers (examples/pytorch/train.py, each a
process) training to a bar under every consistency model, beside a C++ worker, and after being
SIGKILLed and started again."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import paramserver
import paramserver.staging
import paramserver.torch
from conftest import BIN_DIR, pause

EXAMPLE = os.path.join(os.path.dirname(__file__), "../../examples/pytorch/train.py")
sys.path.insert(0, os.path.dirname(EXAMPLE))
import train as example  # noqa: E402  (the example's models)


@pytest.fixture
def cnn(tmp_path):
    """The example CNN's tensor layout in a file, as a user starts the shards with it."""
    path = tmp_path / "cnn.json"
    path.write_text(json.dumps(paramserver.torch.layout_of(example.SmallCnn())))
    return str(path)


def layout(module):
    return json.dumps(paramserver.torch.layout_of(module))


def train(shards, rank, workers, *flags):
    return subprocess.Popen([sys.executable, EXAMPLE, f"--ps={shards.addresses}", f"--rank={rank}",
                             f"--num_workers={workers}", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process, timeout=300):
    out, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, out
    return out


def accuracy_in(out):
    return float(re.search(r"test accuracy ([0-9.]+)", out).group(1))


@pytest.mark.parametrize("consistency,flags", [
    ("async", ("--optimizer=sgd", "--lr=0.05")),
    ("sync", ("--optimizer=sgd", "--lr=0.05")),
    ("local:4", ()),
    ("easgd:4", ()),
])
def test_two_python_workers_train_a_cnn_on_two_shards(start_shards, cnn, consistency, flags):
    # 300 steps each: 0.77-0.80 async, about as much sync (measured), but one sync run on a
    # 2-core machine with both cores busy stalled at 0.596 (loss flat at 0.93 from step 100); a
    # model that did not train stays near 0.1.
    shards = start_shards(2, cnn, workers=2, flags=(f"--consistency={consistency}", *flags))
    workers = [train(shards, r, 2, "--steps=300") for r in range(2)]
    for out in map(finish, workers):
        assert f"shards run {consistency}" in out
        assert accuracy_in(out) >= 0.5, out


def test_a_cpp_and_a_python_worker_train_one_mlp(start_shards):
    shards = start_shards(2, "mlp:784-32-10", workers=2, flags=("--optimizer=sgd", "--lr=0.1"))
    cpp = subprocess.Popen([os.path.join(BIN_DIR, "worker"), f"--ps={shards.addresses}",
                            "--rank=0", "--num_workers=2", "--hidden=32", "--steps=600",
                            "--retry_seconds=60"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    python = train(shards, 1, 2, "--arch=mlp:32", "--steps=600")
    out = finish(python)
    assert accuracy_in(out) >= 0.7, out
    finish(cpp)
    stats = paramserver.Client(ps=shards.addresses, model="mlp:784-32-10").stats()
    applied = {w["worker_id"]: int(w["pushes_applied"]) for w in stats[0]["workers"]}
    assert applied.get(0, 0) == 600 and applied[1] == 600, applied


def test_a_python_worker_killed_and_started_again_resumes(start_shards, cnn):
    shards = start_shards(2, cnn, workers=1, flags=("--optimizer=sgd", "--lr=0.05"))
    first = train(shards, 0, 1, "--steps=100000")
    for line in first.stdout:  # killed on progress, not on time
        if line.startswith("step 200 "):
            break
    first.send_signal(signal.SIGKILL)
    first.wait()
    again = finish(train(shards, 0, 1, "--steps=400"))
    resumed = int(re.search(r"starting at step (\d+)", again).group(1))
    assert resumed >= 200, again  # the push of step 200 may not have landed
    assert accuracy_in(again) >= 0.6, again


def test_the_adapter_refuses_what_it_cannot_train(start_shards):
    shards = start_shards(1, layout(torch.nn.Linear(3, 2)))
    with pytest.raises(paramserver.InvalidArgument, match="weight is torch.float64; the adapter "
                       "trains float32 parameters"):
        paramserver.torch.DistributedModel(torch.nn.Linear(3, 2).double(), ps=shards.addresses)
    split = torch.nn.Linear(3, 2)
    split.bias = torch.nn.Parameter(torch.zeros(2, device="meta"))
    with pytest.raises(paramserver.InvalidArgument,
                       match="parameter bias is on meta, parameter weight on cpu: the adapter "
                       "trains a module on one device"):
        paramserver.torch.DistributedModel(split, ps=shards.addresses, rank=0)
    with pytest.raises(paramserver.InvalidArgument, match="on meta; the adapter trains them on "
                       "the CPU or a CUDA device"):
        paramserver.torch.DistributedModel(torch.nn.Linear(3, 2, device="meta"),
                                           ps=shards.addresses, rank=0)
    with pytest.raises(paramserver.Error, match="model mismatch"):
        paramserver.torch.DistributedModel(torch.nn.Linear(2, 3), ps=shards.addresses, rank=0)
    with pytest.raises(paramserver.Error, match="model mismatch"):  # the same size, flat
        paramserver.torch.DistributedModel(torch.nn.Linear(3, 2), ps=shards.addresses, rank=0,
                                           model="flat:8")
    local = start_shards(1, layout(torch.nn.Linear(3, 2)), flags=("--consistency=local:2",))
    with pytest.raises(paramserver.InvalidArgument, match="pass optimizer="):
        paramserver.torch.DistributedModel(torch.nn.Linear(3, 2), ps=local.addresses, rank=0)


def test_parameters_and_gradients_are_views_into_the_flat_buffers(start_shards):
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    # sync: step() pushes, then pulls the round's weights (async would prefetch, maybe earlier).
    shards = start_shards(1, layout(module),
                          flags=("--optimizer=sgd", "--lr=1", "--consistency=sync"))
    initial = paramserver.torch.weights_of(module).copy()
    with paramserver.torch.DistributedModel(module, ps=shards.addresses, rank=0) as model:
        assert np.array_equal(paramserver.torch.weights_of(module), initial)
        with model.no_sync():
            module(torch.ones(1, 3)).sum().backward()
        grads = np.concatenate([p.grad.reshape(-1).numpy().copy() for p in module.parameters()])
        module.zero_grad(set_to_none=True)  # autograd's next gradients land elsewhere ...
        module(torch.ones(1, 3)).sum().backward()  # ... and are taken back into the buffer
        model.step()
        model(torch.ones(1, 3))  # waits for the push and the pull
        assert np.allclose(paramserver.torch.weights_of(module), initial - grads, atol=1e-6)
        assert model.steps == 1


def test_backward_sends_each_shard_its_part_once_its_gradients_are_in(start_shards, monkeypatch):
    first, last = torch.nn.Linear(2, 2), torch.nn.Linear(2, 20)
    module = torch.nn.Sequential(first, last)  # 6 + 60 values: shard 1 holds last's only
    shards = start_shards(2, layout(module), flags=("--optimizer=sgd", "--lr=1"))
    observer = paramserver.Client(ps=shards.addresses, model=layout(module))

    def versions():
        return [int(s.get("version", 0)) for s in observer.stats()]

    seen = []

    def at_first_layer(grad):  # backward reached the first layer: the last is pushed already
        deadline = time.monotonic() + 30
        while versions()[1] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(versions())

    filled = []  # how far from the end the gradient was final, as backward told the push
    tell = paramserver.client.OverlappedStep.gradient_final

    def told(step, begin, end):
        tell(step, begin, end)
        if step.filled_from < (filled[-1] if filled else 66):
            filled.append(step.filled_from)

    monkeypatch.setattr(paramserver.client.OverlappedStep, "gradient_final", told)
    with paramserver.torch.DistributedModel(module, ps=shards.addresses, rank=0) as model:
        assert model.client.shard_ranges == [(0, 33), (33, 66)]
        first.weight.register_hook(at_first_layer)
        model(torch.ones(1, 2)).sum().backward()
        assert seen == [[0, 1]]
        # last's 60 values (from offset 6) before first's 6, each told once it was in.
        assert 6 in filled and filled[-1] == 0, filled
        assert filled == sorted(set(filled), reverse=True), filled
        model.step()
        model(torch.ones(1, 2))  # waits for the push and the pull
        assert versions() == [1, 1]
    observer.close()


@pytest.mark.parametrize("staging", [False, True])
def test_forward_starts_on_the_first_layers_weights_while_the_last_shards_are_coming(
        start_shards, monkeypatch, staging):
    # staging: the module's own parameters, each layer's copied in once its weights are in.
    first, last = torch.nn.Linear(2, 2), torch.nn.Linear(2, 20)
    module = torch.nn.Sequential(first, last)  # 6 + 60 values: shard 0 holds all of first's
    shards = start_shards(2, layout(module), flags=("--optimizer=sgd", "--lr=1"))
    initial = paramserver.torch.weights_of(module).copy()
    order = []
    weights_needed = paramserver.client.OverlappedStep.weights_needed

    def logged(step, begin, end, timeout=None):
        if timeout is None:  # (staging looks whether the next layers' are in, not waiting)
            order.append(f"wait {begin}-{end}")
        return weights_needed(step, begin, end, timeout)

    monkeypatch.setattr(paramserver.client.OverlappedStep, "weights_needed", logged)
    observer = paramserver.Client(ps=shards.addresses, model=layout(module))
    stopped = shards.processes[1]
    try:
        # A pass that waited for the whole pull would wait for the stopped shard: its retries
        # end (and the test fails) after retry_seconds.
        with paramserver.torch.DistributedModel(module, ps=shards.addresses, rank=0,
                                                retry_seconds=15, staging=staging) as model:
            x = torch.ones(1, 2)
            model(x).sum().backward()
            grads = model._grads.numpy().copy()
            deadline = time.monotonic() + 30  # the push is in at both shards before shard 1 stops
            while [int(s.get("version", 0)) for s in observer.stats()] != [1, 1]:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            pause(stopped)
            model.step()  # the next step's pull: shard 1 cannot answer its part yet

            def at_first(*_):
                order.append("first")
                with pytest.raises(TimeoutError, match=r"values \[33, 66\)"):  # shard 1's part
                    weights_needed(model._step, 33, 66, 0.05)
                stopped.send_signal(signal.SIGCONT)

            first.register_forward_pre_hook(at_first)
            last.register_forward_pre_hook(lambda *_: order.append("last"))
            order.clear()
            model(x)
            # last's values are [6, 66): shard 0 holds [0, 33), shard 1 the rest
            assert order == ["wait 0-6", "first", "wait 6-33", "wait 33-66", "last"]
            assert model._step.pulled  # waited for whole at the pass's end
            assert np.allclose(paramserver.torch.weights_of(module), initial - grads, atol=1e-6)
    finally:
        stopped.send_signal(signal.SIGCONT)
        observer.close()


class _SmallThenLarge(torch.nn.Module):
    """A small layer, then 128 MiB of weights in the same shard: several times what the sockets
    between a shard and its client hold, so a stopped shard holds the pull's rest up."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(2, 2)
        self.large = torch.nn.Embedding(1 << 23, 4)
        self.between = lambda: None

    def forward(self, x):
        h = self.first(x).sum()
        self.between()
        return h + self.large(torch.tensor([1])).sum()


def test_a_pull_failing_under_weights_the_forward_pass_used_is_made_again(start_shards):
    module = _SmallThenLarge()
    shards = start_shards(1, layout(module), flags=("--optimizer=sgd", "--lr=1"))
    stopped = shards.processes[0]
    initial = paramserver.torch.weights_of(module).copy()
    passes = []

    def between():
        passes.append(not model._step.pulled)
        if len(passes) == 1:
            # The first layer ran on the pull's first values; the rest of its part cannot come
            # while the shard is stopped, and its attempt fails at its deadline (3 s).
            pause(stopped)
            with pytest.raises(TimeoutError):  # the pull was not in before the shard stopped
                model._step.wait_pull(timeout=0)
            time.sleep(4)
            stopped.send_signal(signal.SIGCONT)

    try:
        with paramserver.torch.DistributedModel(module, ps=shards.addresses, rank=0,
                                                shared_memory=False, rpc_timeout_seconds=3,
                                                retry_seconds=30) as model:
            x = torch.ones(1, 2)
            model(x).backward()
            grads = model._grads.numpy().copy()
            model.step()  # the next step's pull starts
            module.between = between
            model(x)  # large's weights would come from a retry: the pass runs again
            assert passes == [True, False]  # the second on a pull waited for whole
            assert np.array_equal(paramserver.torch.weights_of(module), initial - grads)
    finally:
        stopped.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("staging", [False, True])
def test_no_sync_accumulates_and_a_second_backward_without_it_is_refused(start_shards, staging):
    module = torch.nn.Linear(3, 1)
    shards = start_shards(1, layout(module),
                          flags=("--optimizer=sgd", "--lr=1", "--consistency=sync"))
    initial = paramserver.torch.weights_of(module).copy()
    x = torch.ones(1, 3)
    with paramserver.torch.DistributedModel(module, ps=shards.addresses, rank=0,
                                            staging=staging) as model:
        with model.no_sync():
            model(x).sum().backward()
        model(x).sum().backward()
        model.step()  # pushes the sum: the gradient of sum(w x + b) is 1 everywhere, twice
        model(x).sum().backward()  # waits for the round's weights first
        assert np.allclose(paramserver.torch.weights_of(module), initial - 2, atol=1e-6)
        with pytest.raises(RuntimeError, match="no_sync"):
            model(x).sum().backward()
        # The refused pass wrote nothing: the step's push (sent as its backward ended) carried
        # 1 everywhere. zero_grad() starts the step again on the weights that push made.
        model.zero_grad()
        model(x).sum().backward()
        model.step()
        model(x)
        assert np.allclose(paramserver.torch.weights_of(module), initial - 4, atol=1e-6)
        assert model.steps == 2


def train_in_turns(shards, modules, steps, **options):
    """Trains `modules` as workers of `shards` (sync), in turns on this thread: each step, each
    worker's forward, backward and step() on its own seeded batches. Returns each module's
    weights after the last round."""
    models = [paramserver.torch.DistributedModel(m, ps=shards.addresses, rank=r,
                                                 num_workers=len(modules), **options)
              for r, m in enumerate(modules)]
    batches = [torch.Generator().manual_seed(10 + r) for r in range(len(modules))]
    for _ in range(steps):
        for model, g in zip(models, batches):
            x, y = torch.rand(16, 784, generator=g), torch.randint(10, (16,), generator=g)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            model.step()
    for model in models:
        model(x)  # waits for the last round's weights
        model.close()
    return [paramserver.torch.weights_of(m) for m in modules]


def test_staging_trains_to_the_weights_the_zero_copy_path_does(start_shards, cnn, monkeypatch):
    # The copy path (the module's own tensors, gradients copied out in buckets, weights copied
    # in by layer), forced on the CPU, against parameters that are the buffers' views: the same
    # rounds, bit for bit. 2 shards split the CNN in the middle of a layer; buckets of 1,024
    # values make one of each layer (conv1, conv2, fc1, fc2: 416 to 200,832 values).
    monkeypatch.setattr(paramserver.staging, "BUCKET_VALUES", 1024)
    flags = ("--optimizer=sgd", "--lr=0.05", "--consistency=sync")
    initial = example.SmallCnn()

    def run(staging):
        shards = start_shards(2, cnn, workers=2, flags=flags)
        modules = [example.SmallCnn() for _ in range(2)]
        for m in modules:
            m.load_state_dict(initial.state_dict())
        return train_in_turns(shards, modules, 8, staging=staging)

    staged, viewed = run(True), run(False)
    assert np.array_equal(staged[0], staged[1])
    assert np.array_equal(viewed[0], viewed[1])
    assert np.array_equal(staged[0], viewed[0])
    assert not np.array_equal(staged[0], paramserver.torch.weights_of(initial))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_a_module_on_a_gpu_trains_to_the_weights_it_does_on_the_cpu(start_shards, cnn,
                                                                    monkeypatch):
    # fp32 convolutions (cuDNN's default is TF32, 10-bit mantissas): what differs is the order of
    # the sums, within 1e-4 after 8 steps of lr 0.05.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    flags = ("--optimizer=sgd", "--lr=0.05", "--consistency=sync")
    initial = example.SmallCnn()
    weights = {}
    for device in ("cpu", paramserver.torch.local_device()):
        shards = start_shards(2, cnn, workers=1, flags=flags)
        module = example.SmallCnn()
        module.load_state_dict(initial.state_dict())
        model = paramserver.torch.DistributedModel(module.to(device), ps=shards.addresses, rank=0)
        g = torch.Generator().manual_seed(3)
        for _ in range(8):
            x, y = torch.rand(16, 784, generator=g), torch.randint(10, (16,), generator=g)
            torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            model.step()
        model(x.to(device))
        model.close()
        weights[str(device)] = paramserver.torch.weights_of(module)
    cpu, gpu = weights.values()
    assert np.allclose(cpu, gpu, atol=1e-4), np.abs(cpu - gpu).max()


def export(shards, model, out, *source):
    run = subprocess.run([os.path.join(BIN_DIR, "export_model"), f"--model={model}",
                          f"--out={out}", *source], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_an_exported_model_loads_into_the_module_by_name(start_shards, cnn, tmp_path):
    # The shards hold the CNN as its named tensors (cnn.json); export_model writes them under
    # PyTorch's own names and shapes ([out, in] weights), from the live shards and from the
    # checkpoints, and load_state_dict takes the file as it is.
    ckpt = tmp_path / "ckpt"
    shards = start_shards(2, cnn, flags=("--optimizer=sgd", "--lr=0.05", "--consistency=sync",
                                         f"--checkpoint_dir={ckpt}"))
    trained = example.SmallCnn()
    with paramserver.torch.DistributedModel(trained, ps=shards.addresses, rank=0) as model:
        g = torch.Generator().manual_seed(3)
        for _ in range(3):
            x, y = torch.rand(8, 784, generator=g), torch.randint(10, (8,), generator=g)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            model.step()
        model(x)  # sync: waits for the last round's weights
    live = tmp_path / "live.safetensors"
    assert "layout:215370:" in export(shards, cnn, live, f"--ps={shards.addresses}")
    assert shards.stop() == [0, 0]  # a final checkpoint each
    saved = tmp_path / "saved.safetensors"
    export(shards, cnn, saved, f"--checkpoint_dir={ckpt}")
    for path in (live, saved):
        tensors, metadata = paramserver.read_file(str(path))
        assert metadata["model"].startswith("layout:215370:"), metadata
        assert metadata["versions"] == "[3,3]", metadata
        assert list(tensors) == [name for name, _ in trained.named_parameters()]
        restored = example.SmallCnn()
        restored.load_state_dict(paramserver.torch.load_file(str(path)))  # strict: every name
        for (name, a), b in zip(trained.named_parameters(), restored.parameters()):
            assert torch.equal(a, b), name
        assert not torch.equal(trained.conv1.weight, example.SmallCnn().conv1.weight)


def test_a_torn_export_is_refused(start_shards, tmp_path):
    module = torch.nn.Linear(3, 2)
    shards = start_shards(1, layout(module))
    with paramserver.torch.DistributedModel(module, ps=shards.addresses, rank=0):
        pass
    path = tmp_path / "m.safetensors"
    export(shards, layout(module), path, f"--ps={shards.addresses}")
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(paramserver.InvalidArgument, match="checksum mismatch"):
        paramserver.torch.load_file(str(path))


class BatchNormNet(torch.nn.Module):
    """A small CNN with BatchNorm, as a user writes one: parameters and buffers."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 5)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 12 * 12, 10)
        self.norm = torch.nn.BatchNorm1d(10, affine=False)  # buffers, no parameter of its own

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.norm(self.fc(x.flatten(1)))


@pytest.mark.parametrize("staging", [False, True])
def test_batchnorm_buffers_travel_with_the_model(start_shards, tmp_path, staging):
    # The shards hold the buffers after the parameters; a sync round keeps the workers' average,
    # every pull brings it into the modules, and an export loads with strict=True, buffers and
    # all; evaluate() scores with them.
    spec = layout(BatchNormNet())
    assert '"name": "bn.num_batches_tracked", "shape": [], "buffer": true' in spec
    shards = start_shards(2, spec, workers=2,
                          flags=("--optimizer=sgd", "--lr=0.05", "--consistency=sync"))
    modules = [BatchNormNet() for _ in range(2)]
    models = [paramserver.torch.DistributedModel(m, ps=shards.addresses, rank=r, num_workers=2,
                                                 staging=staging)
              for r, m in enumerate(modules)]
    batches = [torch.Generator().manual_seed(20 + r) for r in range(2)]
    for _ in range(4):
        pushed = []
        for model, g in zip(models, batches):
            x, y = torch.rand(16, 1, 28, 28, generator=g), torch.randint(10, (16,), generator=g)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            pushed.append({k: v.clone() for k, v in model.module.state_dict().items()})
            model.step()
    for model in models:
        model.eval()
        model(x)  # eval: the pull of the last round's weights and buffers, no statistics changed
        model.close()
    for name in ("bn.running_mean", "bn.running_var", "norm.running_var"):
        average = (pushed[0][name] + pushed[1][name]) * 0.5  # the shard's sum, then its scale
        assert not torch.equal(pushed[0][name], pushed[1][name]), name
        for m in modules:
            assert torch.equal(m.state_dict()[name], average), name
    assert modules[0].bn.num_batches_tracked.item() == 4
    state = modules[0].state_dict()
    assert all(torch.equal(state[k], v) for k, v in modules[1].state_dict().items())

    path = tmp_path / "bn.safetensors"
    export(shards, spec, path, f"--ps={shards.addresses}")
    restored = BatchNormNet()
    restored.load_state_dict(paramserver.torch.load_file(str(path)))  # strict: buffers too
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in state.items())

    seen = []

    def score(module):
        seen.append({k: v.clone() for k, v in module.state_dict().items()})
        os.kill(os.getpid(), signal.SIGTERM)  # (evaluate's handler stops it after this score)
        return 0.0, 0.0

    evaluated = BatchNormNet().eval()
    paramserver.torch.evaluate(evaluated, score, ps=shards.addresses, model=spec, csv="")
    assert all(torch.equal(seen[-1][k], v) for k, v in state.items())


def test_a_module_with_buffers_is_refused_compression(start_shards):
    shards = start_shards(1, layout(BatchNormNet()))
    with pytest.raises(paramserver.InvalidArgument, match="compression would garble"):
        paramserver.torch.DistributedModel(BatchNormNet(), ps=shards.addresses, rank=0,
                                           compress="int8")


def test_local_sgd_trades_the_buffers_with_the_model(start_shards, tmp_path):
    # local:2 with one worker: every second step the centre becomes this worker's model (its
    # change added), buffers included.
    spec = layout(BatchNormNet())
    shards = start_shards(1, spec, flags=("--consistency=local:2",))
    module = BatchNormNet()
    g = torch.Generator().manual_seed(5)
    with paramserver.torch.DistributedModel(
            module, ps=shards.addresses, rank=0,
            optimizer=torch.optim.SGD(module.parameters(), lr=0.05)) as model:
        for _ in range(4):
            x, y = torch.rand(16, 1, 28, 28, generator=g), torch.randint(10, (16,), generator=g)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            model.step()
    path = tmp_path / "local.safetensors"
    export(shards, spec, path, f"--ps={shards.addresses}")
    exported = paramserver.torch.load_file(str(path))
    assert module.bn.num_batches_tracked.item() == 4
    for name, value in module.state_dict().items():
        assert torch.allclose(exported[name].to(value.dtype), value, atol=1e-6), name
