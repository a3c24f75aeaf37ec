#!/usr/bin/env python3
"""torch_mlp_bench: the PyTorch peer of compute_bench.

Same models, batch sizes and precision, and the same work per step as compute_bench (a worker's
step): the parameters copied up from one host tensor (a worker gets them from the shards), the
batch's indices copied up and the batch gathered from a training set held in device memory,
forward, backward, and every parameter gradient copied into one host tensor. Host tensors are
pinned on a GPU, as the worker's are. One difference remains in bf16: autocast runs the layers'
outputs in bf16, while compute_bench's bf16 only rounds the GEMM inputs (fp32 storage throughout).

    python3 bench/torch_mlp_bench.py --device cuda --tf32 --csv results.csv
    python3 bench/torch_mlp_bench.py --device cpu --threads 2

Timing: the wall clock around each step, which ends with a device synchronisation after the
gradient copies. The ceiling is a square matrix product (1024^3 on the CPU, 4096^3 on a GPU) in the
same precision, timed over N products followed by a synchronisation. FLOPs are counted as in
compute_bench: 2*m*n*k per GEMM, 3 GEMMs per layer except the first (no input gradient).
"""

import argparse
import csv
import os
import statistics
import sys
import time

import torch
from torch import nn

CSV_HEADER = ["bench", "device", "config", "batch", "ms", "samples_per_s", "gflops",
              "ceiling_gflops", "ratio"]


def parse_config(text):
    layers, _, batch = text.partition(":")
    try:
        sizes = [int(s) for s in layers.split("-")]
        batch = int(batch)
    except ValueError:
        sys.exit(f"torch_mlp_bench: bad --configs entry '{text}': expected LAYERS:BATCH like "
                 "784-256-10:256")
    if len(sizes) < 2 or min(sizes) <= 0 or batch <= 0:
        sys.exit(f"torch_mlp_bench: bad --configs entry '{text}'")
    return layers, sizes, batch


def step_flops(sizes, batch):
    return sum((2 if l == 0 else 3) * 2.0 * batch * sizes[l] * sizes[l + 1]
               for l in range(len(sizes) - 1))


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_ceiling(device, dtype, n, calls, samples=5):
    """GFLOP/s of one n^3 matrix product in `dtype` (tf32 follows the global matmul setting)."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    a = torch.rand(n, n, generator=gen).mul_(2).sub_(1).to(device=device, dtype=dtype)
    b = torch.rand(n, n, generator=gen).mul_(2).sub_(1).to(device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=c)
    synchronize(device)
    rates = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=c)
        synchronize(device)
        rates.append(2.0 * n ** 3 * calls / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def run_config(args, device, sizes, batch):
    torch.manual_seed(args.seed)
    layers = []
    for l in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[l], sizes[l + 1]))
        if l + 2 < len(sizes):
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).to(device)
    params = list(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    pin = device.type == "cuda"
    num_params = sum(p.numel() for p in params)

    # The training set in device memory (8 batches, at least 4096 examples), as the worker keeps
    # it; a fixed rotation of batches' indices in host memory.
    count = max(4096, 8 * batch)
    features = torch.rand(count, sizes[0]).to(device)
    targets = torch.randint(0, sizes[-1], (count,)).to(device)
    batches = [torch.randperm(count)[:batch].to(torch.int32) for _ in range(8)]
    batches = [b.pin_memory() for b in batches] if pin else batches
    next_batch = [0]
    # Host memory the worker holds: the pulled parameters, the gradient.
    host_grad = torch.empty(num_params, pin_memory=pin)
    host_params = torch.empty(num_params, pin_memory=pin)
    with torch.no_grad():
        torch.cat([p.detach().reshape(-1).cpu() for p in params], out=host_params)
    grad_views, param_views, offset = [], [], 0
    for p in params:
        grad_views.append(host_grad[offset:offset + p.numel()].view_as(p))
        param_views.append(host_params[offset:offset + p.numel()].view_as(p))
        offset += p.numel()

    use_bf16 = args.bf16 and device.type == "cuda"

    def step():
        host_index = batches[next_batch[0] % len(batches)]
        next_batch[0] += 1
        start = time.perf_counter()
        with torch.no_grad():
            for p, h in zip(params, param_views):
                p.copy_(h, non_blocking=pin)
        index = host_index.to(device, non_blocking=pin)
        x = features.index_select(0, index)
        y = targets.index_select(0, index)
        for p in params:
            p.grad = None
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        for p, h in zip(params, grad_views):
            h.copy_(p.grad, non_blocking=pin)
        synchronize(device)
        seconds = time.perf_counter() - start
        if not torch.isfinite(loss).item():
            sys.exit(f"torch_mlp_bench: non-finite loss {loss.item()}")
        return seconds

    last = 0.0
    for _ in range(max(1, args.warmup)):
        last = step()
    steps = min(max(3, int(args.budget_seconds / last)), max(3, args.iters))
    times = [step() for _ in range(steps)]
    return steps, num_params, statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--iters", type=int, default=20, help="timed steps per config, at most")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per config")
    parser.add_argument("--budget_seconds", type=float, default=10,
                        help="time each config for about this long (at least 3 steps)")
    parser.add_argument("--configs", default="784-256-128-10:256,784-4096-4096-10:1024",
                        help="comma-separated LAYERS:BATCH entries")
    parser.add_argument("--tf32", action="store_true", help="tf32 matrix products (GPU)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    parser.add_argument("--csv", default="", help="append one row per config here")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.tf32 and args.bf16:
        sys.exit("torch_mlp_bench: --tf32 and --bf16 exclude each other")

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("torch_mlp_bench: --device cuda, but torch sees no GPU")
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    elif args.tf32 or args.bf16:
        sys.exit("torch_mlp_bench: --tf32 and --bf16 are for --device cuda")
    torch.set_num_threads(args.threads)
    # Recent PyTorch (2.9+) deprecates allow_tf32 and refuses a mix of the two APIs: use one.
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if args.tf32 else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = args.tf32

    gpu = device.type == "cuda"
    math = "bf16" if args.bf16 else "tf32" if args.tf32 else "fp32"
    label = f"cuda:{device.index}/{math}" if gpu else f"cpu/{args.threads}thr"
    bench = "torch_mlp_bench"
    configs = [parse_config(c) for c in args.configs.split(",") if c]

    n, calls = (4096, 20) if gpu else (1024, 3)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    ceiling_before = gemm_ceiling(device, dtype, n, calls)
    print(f"{bench} on {label} (torch {torch.__version__}"
          f"{', ' + torch.cuda.get_device_name(device) if gpu else ''}): one step = "
          "params + batch indices up, batch gathered on the device, forward, backward, "
          "gradients copied into one host tensor")
    results = [(name, sizes, batch) + run_config(args, device, sizes, batch)
               for name, sizes, batch in configs]
    ceiling_after = gemm_ceiling(device, dtype, n, calls)
    ceiling = max(ceiling_before, ceiling_after)
    print(f"ceiling: torch.mm {n}^3 {math} = {ceiling:.1f} GFLOP/s (median of 5 samples of {calls} "
          f"calls, each ended by a synchronisation; {ceiling_before:.1f} before the configs, "
          f"{ceiling_after:.1f} after, the higher is used)")
    print(f"{'config':<20} {'batch':>6} {'params':>10} {'steps':>6} {'ms/step':>10} "
          f"{'samples/s':>12} {'GFLOP/s':>10} {'ceiling':>10} {'ratio':>7}")
    rows = []
    for name, sizes, batch, steps, num_params, seconds in results:
        gflops = step_flops(sizes, batch) / seconds / 1e9
        ratio = gflops / ceiling
        print(f"{name:<20} {batch:>6} {num_params:>10} {steps:>6} {seconds * 1e3:>10.3f} "
              f"{batch / seconds:>12.1f} {gflops:>10.1f} {ceiling:>10.1f} {ratio:>7.3f}")
        rows.append([bench, label, name, batch, f"{seconds * 1e3:.4f}", f"{batch / seconds:.1f}",
                     f"{gflops:.2f}", f"{ceiling:.2f}", f"{ratio:.4f}"])
    if args.csv:
        new = not os.path.exists(args.csv) or os.path.getsize(args.csv) == 0
        with open(args.csv, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(CSV_HEADER)
            writer.writerows(rows)


if __name__ == "__main__":
    main()
