#!/usr/bin/env python3
"""A PyTorch model trained on Fashion-MNIST through the parameter servers by one worker of a job.

Start the shards with the model's tensor layout (this script writes it: --print_model_spec), then
one of these per worker:

    /usr/bin/python3 examples/pytorch/train.py --print_model_spec > cnn.json   # ps --model=cnn.json
    /usr/bin/python3 examples/pytorch/train.py --ps=127.0.0.1:50051,127.0.0.1:50052 --rank=0 \
        --num_workers=2 --steps=2000

The training loop is a plain PyTorch one; the three lines marked "paramserver" are the change.
`launch` and `experiment` run it as their workers and evaluator (it reads their PS_* settings):

    build/bin/launch --model=cnn.json --workers=4 --steps=500 \
        --worker_cmd="/usr/bin/python3 examples/pytorch/train.py" \
        --eval_cmd="/usr/bin/python3 examples/pytorch/train.py --evaluate"

--arch=cnn (default) is a small CNN; --arch=mlp:H is the C++ workers' MLP (784-H-10, the same
tensor layout), so Python and C++ workers can train one model side by side.
"""
import argparse
import gzip
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

import paramserver.torch  # paramserver

DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def load(split, data_dir):
    with gzip.open(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return (torch.from_numpy(images.astype(np.float32) / 255.0),
            torch.from_numpy(labels.astype(np.int64)))


class CppMlp(torch.nn.Module):
    """The C++ workers' MLP (trainer/network.h): x W + b per layer, W stored [in, out], ReLU
    between layers; the parameters in the flat layout of mlp:784-H-...-10."""

    def __init__(self, sizes, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weights = torch.nn.ParameterList()
        for fan_in, fan_out in zip(sizes, sizes[1:]):
            bound = (6.0 / (fan_in + fan_out)) ** 0.5
            self.weights.append(torch.nn.Parameter(
                (torch.rand(fan_in, fan_out, generator=g) * 2 - 1) * bound))
            self.weights.append(torch.nn.Parameter(torch.zeros(fan_out)))

    def forward(self, x):
        layers = len(self.weights) // 2
        for i in range(layers):
            x = x @ self.weights[2 * i] + self.weights[2 * i + 1]
            if i + 1 < layers:
                x = F.relu(x)
        return x


class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make_model(arch, seed):
    torch.manual_seed(seed)
    if arch == "cnn":
        return SmallCnn(), None
    if arch.startswith("mlp:"):
        sizes = [784] + [int(h) for h in arch[4:].split(",") if h] + [10]
        return CppMlp(sizes, seed), "mlp:" + "-".join(map(str, sizes))
    raise SystemExit(f"--arch must be cnn or mlp:H[,H...], not {arch}")


def env(name, default, kind=str):
    """A default from the environment `launch --worker_cmd` sets (PS_STEPS, PS_SEED, ...)."""
    return kind(os.environ.get("PS_" + name.upper(), default))


def score_on(test_x, test_y):
    def score(model):
        with torch.no_grad():
            logits = model(test_x)
            return (F.cross_entropy(logits, test_y).item(),
                    (logits.argmax(1) == test_y).float().mean().item())
    return score


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ps", help="the shards, host:port,... (or --cluster; else $PS_PS)")
    p.add_argument("--cluster", help="a cluster spec (shards, workers, credentials)")
    p.add_argument("--rank", type=int, default=env("rank", 0, int))
    p.add_argument("--num_workers", type=int, default=env("num_workers", 1, int))
    p.add_argument("--arch", default="cnn", help="cnn, or mlp:H[,H...] (the C++ workers' MLP)")
    p.add_argument("--steps", type=int, default=env("steps", 1000, int),
                   help="this worker's training steps (0: no limit)")
    p.add_argument("--max_seconds", type=float, default=env("max_seconds", 0, float),
                   help="stop after this long (0: no limit)")
    p.add_argument("--batch_size", type=int, default=env("batch_size", 64, int))
    p.add_argument("--local_lr", type=float, default=env("local_lr", 0.05, float),
                   help="local:H and easgd only")
    p.add_argument("--local_momentum", type=float, default=env("local_momentum", 0.9, float))
    p.add_argument("--threads", type=int, default=env("threads", 0, int),
                   help="torch intra-op threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=env("seed", 1, int))
    p.add_argument("--data_dir", default=env("data_dir", DATA))
    p.add_argument("--token_file", default=None)
    p.add_argument("--print_model_spec", action="store_true",
                   help="print the --model to start the shards with, and exit")
    p.add_argument("--evaluate", action="store_true",
                   help="be the job's evaluator: score the shards' weights on the test set "
                   "until SIGTERM (launch --eval_cmd)")
    args = p.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, spec = make_model(args.arch, args.seed)
    spec = spec or paramserver.torch.layout_of(model)
    if args.print_model_spec:
        print(spec if isinstance(spec, str) else json.dumps(spec))
        return 0
    given = {"ps": args.ps, "cluster": args.cluster, "token_file": args.token_file}
    settings = {k: v for k, v in given.items() if v is not None}
    test_x, test_y = load("t10k", args.data_dir)
    if args.evaluate:
        paramserver.torch.evaluate(model, score_on(test_x, test_y), model=spec, **settings)
        return 0
    x, y = load("train", args.data_dir)
    n, w = len(x), args.num_workers
    part = slice(args.rank * n // w, (args.rank + 1) * n // w)
    x, y = x[part], y[part]

    local = torch.optim.SGD(model.parameters(), lr=args.local_lr, momentum=args.local_momentum)
    model = paramserver.torch.DistributedModel(  # paramserver
        model, optimizer=local, rank=args.rank, num_workers=args.num_workers, model=spec,
        **settings)
    stop = threading.Event()

    def on_sigterm(*_):  # the launcher stopping the run: end calls in flight (a sync round that
        stop.set()       # will not close now); the loop then leaves
        model.client.cancel()

    signal.signal(signal.SIGTERM, on_sigterm)
    name = spec if isinstance(spec, str) else f"{len(spec['tensors'])} tensors"
    print(f"worker {args.rank}: {name} ({model.client.total_params} parameters), shards run "
          f"{model.consistency}, starting at step {model.first_step}", flush=True)
    if model.slowdown > 1:
        print(f"worker {args.rank}: a straggler, computing {model.slowdown:g}x slower", flush=True)
    g = torch.Generator().manual_seed(args.seed * 1000003 + args.rank)
    start = time.time()
    step = model.first_step
    try:
        while (args.steps == 0 or step < args.steps) and not stop.is_set() and \
                (args.max_seconds == 0 or time.time() - start < args.max_seconds):
            batch = torch.randint(len(x), (args.batch_size,), generator=g)
            loss = F.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            if stop.is_set():
                break
            model.step(loss)  # paramserver
            if step % 100 == 0 or step + 1 == args.steps:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            step += 1
    except paramserver.Error:
        if not stop.is_set():
            raise
    finally:
        model.close()
    if stop.is_set():
        print(f"worker {args.rank}: stopped at step {step}", flush=True)
        return 0
    elapsed = time.time() - start
    print(f"worker {args.rank}: done at step {step} in {elapsed:.1f} s; test accuracy "
          f"{score_on(test_x, test_y)(model)[1]:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
