#!/usr/bin/env python3
"""The Python client's push and pull rate against the C++ client's, in one run.

For each size, starts one shard of flat:N and times the Python client (paramserver, through the
C API) pushing from and pulling into NumPy arrays over each path a worker can take: gRPC, the
data plane (a shard on another host) and shared memory (median of --repeats calls); then runs
build/bin/transport_bench at the same sizes for the C++ client's rates on the same machine, and
prints both with their ratio. At 1 MiB the ratio shows what a call costs Python itself.

    PYTHONPATH=build/python python3 bench/python_client_bench.py --bin_dir=build/bin
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import paramserver

# A path's client settings, and transport_bench's columns for it (push, pull).
PATHS = {
    "grpc": ({"shared_memory": False, "data_plane": False}, ("push GB/s", "pull GB/s")),
    "plane": ({"shared_memory": False, "data_plane": True}, ("plane push", "plane pull")),
    "shm": ({"shared_memory": True}, ("shm push", "shm pull")),
}


def median_seconds(repeats, fn):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def python_rates(bin_dir, mib, repeats):
    """{(path, "push"|"pull"): bytes/s} for flat tensors of `mib` MiB."""
    n = int(mib * (1 << 20)) // 4
    run_dir = tempfile.mkdtemp(prefix="python-client-bench-")
    port_file = os.path.join(run_dir, "port")
    ps = subprocess.Popen([os.path.join(bin_dir, "ps"), "--shard_index=0", "--num_shards=1",
                           f"--model=flat:{n}", "--num_workers=1", "--host=127.0.0.1", "--port=0",
                           f"--port_file={port_file}", "--optimizer=sgd", "--lr=0.001"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if ps.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"the shard did not start (exit status {ps.poll()})")
            time.sleep(0.05)
        address = f"127.0.0.1:{open(port_file).read().strip()}"
        rates = {}
        weights, gradient = np.zeros(n, np.float32), np.full(n, 1e-3, np.float32)
        for path, (settings, _) in PATHS.items():
            with paramserver.Client(ps=address, model=f"flat:{n}", rank=0, num_workers=1,
                                    **settings) as client:
                client.register()
                client.initialize(weights)
                push = median_seconds(repeats, lambda: client.push(gradient))
                pull = median_seconds(repeats, lambda: client.pull(weights))
                rates[path, "push"], rates[path, "pull"] = n * 4 / push, n * 4 / pull
        return rates
    finally:
        ps.send_signal(signal.SIGTERM)
        ps.wait()


def cpp_rates(bin_dir, sizes, repeats):
    """{(mib, path, "push"|"pull"): bytes/s} from transport_bench's table, read by column name."""
    out = subprocess.run([os.path.join(bin_dir, "transport_bench"),
                          "--sizes_mib=" + ",".join(f"{s:g}" for s in sizes),
                          f"--repeats={repeats}", "--tcp_seconds=0"],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("size "))
    groups = [g.strip() for g in header.split("|")]

    def column(row, name):
        for i, group in enumerate(groups):
            if group.startswith(name):  # the group's first value
                return float(row[i].split()[0])
            if name in group:  # a group of two: "x push /y  x pull /y"
                return float(row[i].split()[2])
        raise RuntimeError(f"transport_bench printed no column '{name}': {header}")

    rates = {}
    for mib in sizes:
        label = f"{mib:g} MiB"
        row = next(line for line in lines if line.strip().startswith(label + " ")).split("|")
        for path, (_, (push, pull)) in PATHS.items():
            rates[mib, path, "push"] = column(row, push) * 1e9
            rates[mib, path, "pull"] = column(row, pull) * 1e9
    return rates


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin_dir", default="build/bin")
    p.add_argument("--sizes_mib", default="1,40", help="tensor sizes, comma-separated")
    p.add_argument("--repeats", type=int, default=11)
    args = p.parse_args()
    sizes = [float(s) for s in args.sizes_mib.split(",")]
    if args.repeats < 1 or not sizes or min(sizes) <= 0:
        p.error("--repeats must be >= 1 and --sizes_mib positive")
    py = {(mib, *key): rate for mib in sizes
          for key, rate in python_rates(args.bin_dir, mib, args.repeats).items()}
    cpp = cpp_rates(args.bin_dir, sizes, args.repeats)
    print(f"flat float32 tensors, 1 shard, 1 client, median of {args.repeats} calls")
    print(f"{'size':>8} | {'path':<10} | {'Python GB/s':>11} | {'C++ GB/s':>9} | {'Python/C++':>10}")
    for mib in sizes:
        for path in PATHS:
            for op in ("push", "pull"):
                key = (mib, path, op)
                print(f"{mib:>4g} MiB | {path + ' ' + op:<10} | {py[key] / 1e9:>11.2f} | "
                      f"{cpp[key] / 1e9:>9.2f} | {py[key] / cpp[key]:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
