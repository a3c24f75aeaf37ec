#!/usr/bin/env python3
"""pytorch_ddp_bench: the PyTorch adapter against PyTorch's own DistributedDataParallel (gloo).

The same model (examples/pytorch/train.py's CNN, 215,370 parameters), the same data (Fashion-MNIST,
worker r takes the r-th of W equal parts), the same batch per worker and total batch, the same
seeds and the same SGD learning rate, trained for the same number of steps per worker by:

  ddp    W processes, DistributedDataParallel over gloo on 127.0.0.1 (gradients averaged by
         allreduce, then SGD): the ceiling the synchronous modes are measured against;
  sync   W Python workers through 2 shards under --consistency=sync (a round averages the W
         gradients, then SGD on the shards: the same arithmetic as ddp);
  async  the same under --consistency=async (every gradient applied as it arrives).
  sync-after, async-after
         the same with the push made after backward (DistributedModel(overlap=False)) rather
         than each shard's part as soon as backward has produced it: what overlap buys.
  sync-staging, async-staging
         the same with DistributedModel(staging=True): the copy path a GPU module takes (the
         module's own parameters, gradients copied out in buckets, weights copied in by layer)
         forced on the CPU: its cost against the zero-copy views.

  local  one process, a plain PyTorch loop of batch --workers x --batch_size: the adapter's
         overhead is measured against it (with --workers=1), and W workers sharing one device
         against one process with their total batch.

On a GPU (--device=cuda: every process trains on its local_device(), the one GPU they share;
ddp stays on the CPU), with --arch=resnet18 (torchvision's, 10 classes, on 32x32x3 inputs) and
--synthetic data (random inputs and labels held on the device; no accuracy is scored):

    python3 bench/pytorch_ddp_bench.py --device=cuda --synthetic --arch=resnet18 --workers=1 \
        --batch_size=128 --steps=100 --seeds=1 --modes=local,async,sync

Each worker uses one intra-op thread. examples/s is each worker's steps x batch over its own time
from its first step to its last, summed over the workers: the rate the job consumes examples at.
The accuracy is the test accuracy of the final weights (the shards' or rank 0's); the time to
--target is when rank 0's weights first reached it (snapshots every --snapshot_every steps,
scored after the run so that scoring takes no time from training). With
--straggler=R:F worker R computes F times slower (it sleeps F-1 times its compute time per step,
as launch --straggler does): synchronous training waits for it every step, asynchronous does not.
After a sync or async run the shards' counters are printed: each one's version (under sync the
rounds it closed, --steps when every round had every worker), its pushes applied and dropped as
late, and under sync the contributions missing from its rounds (> 0: a round closed short).
Worker 0's time per step is split into forward (with the adapter under async: also waiting for the
prefetched weights), backward and the step (the optimizer; with the adapter the push and pull, and
under sync the wait for the round).

    /usr/bin/python3 bench/pytorch_ddp_bench.py --workers=4 --steps=200 --seeds=1,2,3
    /usr/bin/python3 bench/pytorch_ddp_bench.py --workers=4 --steps=200 --seeds=1,2,3,4,5 \
        --modes=ddp,sync
    /usr/bin/python3 bench/pytorch_ddp_bench.py --workers=4 --steps=200 --straggler=0:3
    /usr/bin/python3 bench/pytorch_ddp_bench.py --workers=1 --modes=local,sync,async
    /usr/bin/python3 bench/pytorch_ddp_bench.py --modes=sync,sync-after,async,async-after
    /usr/bin/python3 bench/pytorch_ddp_bench.py --workers=1 --modes=async,async-staging
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../examples/pytorch"))
BIN = os.environ.get("PS_BIN_DIR", os.path.join(HERE, "../build/bin"))
sys.path.insert(0, os.path.join(BIN, "../python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import paramserver  # noqa: E402
import paramserver.torch  # noqa: E402
import train as example  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data(rank, workers, args):
    """Worker `rank`'s part of the training set, on args.device (--synthetic: 4,096 random
    examples of the model's input shape)."""
    if args.synthetic:
        g = torch.Generator().manual_seed(rank)
        shape = (3, 32, 32) if args.arch == "resnet18" else (784,)
        x, y = torch.rand(4096, *shape, generator=g), torch.randint(10, (4096,), generator=g)
    else:
        x, y = example.load("train", args.data_dir)
        part = slice(rank * len(x) // workers, (rank + 1) * len(x) // workers)
        x, y = x[part], y[part]
    return x.to(args.device), y.to(args.device)


def new_model(args):
    """The benchmark's model, seeded, on args.device."""
    torch.manual_seed(args.seed)
    if args.arch == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=10).to(args.device)
    return example.SmallCnn().to(args.device)


def synchronize(args):
    if args.device.type == "cuda":
        torch.cuda.synchronize(args.device)


def train_loop(model, step_fn, x, y, args, rank):
    """Runs args.steps steps; returns the first step's start and the last step's end (wall
    time) and the seconds spent in forward (with the adapter: and waiting for the weights),
    backward and the step (optimizer, or the adapter's push and pull)."""
    g = torch.Generator().manual_seed(args.seed * 1000003 + rank)
    slowdown = args.slowdown if rank == args.straggler_rank else 1.0
    result = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    snapshots = []  # rank 0: (seconds since its first step, the weights it trains on)
    for i in range(args.steps):
        t0 = time.time()
        result.setdefault("start", t0)
        batch = torch.randint(len(x), (args.batch_size,), generator=g).to(args.device)
        loss = F.cross_entropy(model(x[batch]), y[batch])
        t1 = time.time()
        if rank == 0 and args.snapshot_every and i % args.snapshot_every == 0:  # the weights
            # after forward, which it used
            with torch.no_grad():
                snapshots.append((t0 - result["start"],
                                  torch.cat([p.reshape(-1) for p in model.parameters()])))
        loss.backward()
        if slowdown > 1:
            time.sleep((slowdown - 1) * (time.time() - t0))
        t2 = time.time()
        step_fn()
        t3 = time.time()
        result["forward"] += t1 - t0
        result["backward"] += t2 - t1
        result["step"] += t3 - t2
    synchronize(args)
    result["end"] = time.time()
    if rank == 0 and args.snapshot_every:
        with torch.no_grad():
            snapshots.append((result["end"] - result["start"],
                              torch.cat([p.reshape(-1) for p in model.parameters()])))
        fd, result["snapshots"] = tempfile.mkstemp(prefix="snapshots-")
        os.close(fd)
        torch.save(snapshots, result["snapshots"])
    return result


def time_to(target, snapshots_file, data_dir):
    """Scores rank 0's weight snapshots afterwards (outside the timed run): the seconds until the
    first that reaches `target` accuracy (NaN if none does, or none was taken)."""
    if snapshots_file is None:
        return float("nan")
    snapshots = torch.load(snapshots_file)
    os.remove(snapshots_file)
    test_x, test_y = example.load("t10k", data_dir)
    model = example.SmallCnn()
    for seconds, weights in snapshots:
        paramserver.torch.set_weights(model, weights)
        if example.score_on(test_x, test_y)(model)[1] >= target:
            return seconds
    return float("nan")


def ddp_worker(rank, args, port, out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.workers)
    model = DistributedDataParallel(new_model(args))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = data(rank, args.workers, args)
    dist.barrier()

    def step():
        opt.step()
        opt.zero_grad()

    result = train_loop(model, step, x, y, args, rank)
    if rank == 0:
        test_x, test_y = example.load("t10k", args.data_dir)
        result["accuracy"] = example.score_on(test_x, test_y)(model.module)[1]
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def ps_worker(args):
    torch.set_num_threads(1)
    x, y = data(args.rank, args.workers, args)
    model = paramserver.torch.DistributedModel(
        new_model(args), ps=args.ps, rank=args.rank, num_workers=args.workers,
        overlap=bool(args.overlap), staging=bool(args.staging))
    result = train_loop(model, model.step, x, y, args, args.rank)
    model.close()
    print(json.dumps(result))


def run_local(args):
    """One process, a plain PyTorch loop of the workers' total batch: the step the adapter is
    measured against."""
    torch.set_num_threads(1)
    model = new_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = data(0, 1, args)
    args = argparse.Namespace(**{**vars(args), "batch_size": args.workers * args.batch_size})

    def step():
        opt.step()
        opt.zero_grad()

    result = train_loop(model, step, x, y, args, 0)
    result["batch_size"] = args.batch_size
    return [result], score(args, model), ""


def score(args, model):
    """The test accuracy of `model` (NaN on --synthetic data)."""
    if args.synthetic:
        return float("nan")
    test_x, test_y = example.load("t10k", args.data_dir)
    return example.score_on(test_x.to(args.device), test_y.to(args.device))(model)[1]


def run_ddp(args):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="ddp-") as tmp:
        out = os.path.join(tmp, "result")
        mp.spawn(ddp_worker, args=(args, free_port(), out), nprocs=args.workers)
        results = []
        for r in range(args.workers):
            with open(f"{out}.{r}") as f:
                results.append(json.load(f))
    return results, results[0]["accuracy"], ""


def run_ps(args, mode):
    consistency, _, when = mode.partition("-")
    args.overlap = int(when != "after")
    args.staging = int(when == "staging")
    with tempfile.TemporaryDirectory(prefix="ps-bench-") as tmp:
        processes = []
        try:
            return ps_job(args, consistency, tmp, processes)
        finally:
            for p in processes:  # shards, and workers left by a failure
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()


def ps_job(args, consistency, tmp, processes):
    """Starts 2 shards and the workers (into `processes`), runs them to the end; the workers'
    results, the final weights' test accuracy and what the shards counted (shard_counters)."""
    layout = os.path.join(tmp, "layout.json")
    with open(layout, "w") as f:
        json.dump(paramserver.torch.layout_of(new_model(args)), f)
    ports = []
    for i in range(2):
        port_file = os.path.join(tmp, f"port-{i}")
        with open(os.path.join(tmp, f"ps-{i}.log"), "w") as log:
            processes.append(subprocess.Popen(
                [os.path.join(BIN, "ps"), f"--shard_index={i}", "--num_shards=2",
                 f"--model={layout}", f"--num_workers={args.workers}",
                 f"--consistency={consistency}", "--optimizer=sgd", f"--lr={args.lr}",
                 "--host=127.0.0.1", "--port=0", f"--port_file={port_file}"],
                stdout=subprocess.DEVNULL, stderr=log))
        deadline = time.time() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if processes[-1].poll() is not None or time.time() > deadline:
                sys.exit(f"ps {i} did not start: see {tmp}/ps-{i}.log")
            time.sleep(0.02)
        ports.append(open(port_file).read().strip())
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    env = {**os.environ, "PYTHONPATH": os.path.join(BIN, "../python")}
    workers = [subprocess.Popen(
        [sys.executable, __file__, "--role=ps_worker", f"--ps={addresses}", f"--rank={r}",
         f"--workers={args.workers}", f"--steps={args.steps}", f"--batch_size={args.batch_size}",
         f"--lr={args.lr}", f"--seed={args.seed}", f"--straggler={args.straggler}",
         f"--snapshot_every={args.snapshot_every}", f"--data_dir={args.data_dir}",
         f"--overlap={args.overlap}", f"--staging={args.staging}", f"--device={args.device}",
         f"--arch={args.arch}", *(["--synthetic"] if args.synthetic else [])],
        stdout=subprocess.PIPE, env=env, text=True)
        for r in range(args.workers)]
    processes.extend(workers)
    results = []
    for w in workers:
        out, _ = w.communicate(timeout=3600)
        if w.returncode != 0:
            sys.exit(f"a worker failed (exit {w.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    observer = new_model(args)
    with paramserver.Client(ps=addresses, model=paramserver.torch.layout_of(observer)) as client:
        client.register()
        weights = torch.empty(sum(p.numel() for p in observer.parameters()))
        client.pull(weights)
        counters = shard_counters(client.stats(), args, consistency)
    paramserver.torch.set_weights(observer, weights)
    return results, score(args, observer), counters


def shard_counters(stats, args, consistency):
    """What the shards counted, as text: each one's version (under sync, the rounds it closed:
    --steps when every round had all the workers), the pushes it applied and dropped as late, and
    under sync the contributions missing from its rounds (workers x version - applied: > 0 when a
    round closed with fewer than all the workers)."""
    parts = []
    for s in stats:
        version, applied, late = (int(s.get(k, 0)) for k in
                                  ("version", "pushes_applied", "pushes_dropped_late"))
        missing = (f", {args.workers * version - applied} missing"
                   if consistency == "sync" else "")
        parts.append(f"v{version} applied {applied} late {late}{missing}")
    return "shards: " + "; ".join(parts)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--modes", default="ddp,sync,async")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--straggler", default="", help="RANK:FACTOR")
    p.add_argument("--target", type=float, default=0.7,
                   help="test accuracy whose time-to is reported (rank 0's weights, snapshotted "
                   "every --snapshot_every steps and scored after the run)")
    p.add_argument("--snapshot_every", type=int, default=25)
    p.add_argument("--data_dir", default=example.DATA)
    p.add_argument("--device", default="cpu", help="cpu | cuda (each process: its "
                   "paramserver.torch.local_device())")
    p.add_argument("--arch", default="cnn", choices=("cnn", "resnet18"))
    p.add_argument("--synthetic", action="store_true",
                   help="random data on the device instead of Fashion-MNIST (no accuracy)")
    p.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    p.add_argument("--ps", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--overlap", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--staging", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.device = (paramserver.torch.local_device() if args.device == "cuda"
                   else torch.device(args.device))
    if args.synthetic:
        args.snapshot_every = 0  # no accuracy to reach
    rank, _, factor = args.straggler.partition(":")
    args.straggler_rank = int(rank) if rank else -1
    args.slowdown = float(factor) if factor else 1.0
    if args.role == "ps_worker":
        return ps_worker(args)

    print(f"{args.workers} workers x {args.steps} steps x batch {args.batch_size}, SGD lr "
          f"{args.lr}, straggler {args.straggler or 'none'}; 2 shards for sync/async; {args.arch} "
          f"on {args.device}{', synthetic data' if args.synthetic else ''}")
    rows = {}
    runners = {"ddp": run_ddp, "local": run_local}
    modes = args.modes.split(",")
    if "ddp" in modes and args.device.type != "cpu":
        sys.exit("--modes=ddp runs on the CPU (gloo): leave it out with --device=cuda")
    # Each seed's modes back to back: a change in the (shared) machine's load hits them alike.
    for seed in map(int, args.seeds.split(",")):
        args.seed = seed
        for mode in modes:
            results, accuracy, counters = (runners[mode](args) if mode in runners
                                           else run_ps(args, mode))
            # The rate the job consumes examples at: each worker's own, summed (a straggler
            # holds back the others only where they wait for it).
            rate = sum(args.steps * r.get("batch_size", args.batch_size) / (r["end"] - r["start"])
                       for r in results)
            ms = {k: 1000 * results[0][k] / args.steps for k in ("forward", "backward", "step")}
            reached = time_to(args.target, results[0].get("snapshots"), args.data_dir)
            rows.setdefault(mode, []).append((rate, accuracy, ms, reached))
            when = f"after {reached:.1f} s" if reached == reached else "not reached"
            print(f"  {mode:11s} seed {seed}: {rate:7.0f} examples/s, test accuracy "
                  f"{accuracy:.4f}, {args.target} {when}; worker 0 per step: "
                  f"forward {ms['forward']:.1f} ms, backward {ms['backward']:.1f} ms, step "
                  f"{ms['step']:.1f} ms{'; ' + counters if counters else ''}", flush=True)
    base_mode = "ddp" if "ddp" in rows else "local" if "local" in rows else None
    base = statistics.median(r[0] for r in rows[base_mode]) if base_mode else None
    print(f"\n| mode | examples/s (median) | vs {base_mode or '-'} | test accuracy (median) | "
          f"time to {args.target} (s; median of those that reached it) | "
          "worker 0 ms/step: forward, backward, step |")
    print("|---|---|---|---|---|---|")
    for mode, values in rows.items():
        rate = statistics.median(v[0] for v in values)
        ratio = f"{rate / base:.2f}" if base else "-"
        ms = {k: statistics.median(v[2][k] for v in values) for k in values[0][2]}
        reached = [v[3] for v in values if v[3] == v[3]]
        to = (f"{statistics.median(reached):.1f} ({len(reached)} of {len(values)})" if reached
              else f"not reached (0 of {len(values)})")
        print(f"| {mode} | {rate:.0f} | {ratio} | {statistics.median(v[1] for v in values):.4f}"
              f" | {to} | {ms['forward']:.1f}, {ms['backward']:.1f}, {ms['step']:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
