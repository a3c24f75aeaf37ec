#!/usr/bin/env python3
"""The Python client's push and pull rate against the C++ client's, in one run.

Starts one shard of flat:N (40 MiB of float32) and times the Python client (paramserver, through
the C API) pushing from and pulling into NumPy arrays, over gRPC and over shared memory (median of
--repeats); then runs build/bin/transport_bench at the same size for the C++ client's rates on
the same machine, and prints both with their ratio.

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

MIB = 40
N = MIB * (1 << 20) // 4


def median_seconds(repeats, fn):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def python_rates(bin_dir, repeats):
    run_dir = tempfile.mkdtemp(prefix="python-client-bench-")
    port_file = os.path.join(run_dir, "port")
    ps = subprocess.Popen([os.path.join(bin_dir, "ps"), "--shard_index=0", "--num_shards=1",
                           f"--model=flat:{N}", "--num_workers=1", "--host=127.0.0.1", "--port=0",
                           f"--port_file={port_file}", "--optimizer=sgd", "--lr=0.001"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            time.sleep(0.05)
        address = f"127.0.0.1:{open(port_file).read().strip()}"
        rates = {}
        weights, gradient = np.zeros(N, np.float32), np.full(N, 1e-3, np.float32)
        for shared in (False, True):
            with paramserver.Client(ps=address, model=f"flat:{N}", rank=0, num_workers=1,
                                    shared_memory=shared) as client:
                client.register()
                client.initialize(weights)
                way = "shm" if shared else "grpc"
                push = median_seconds(repeats, lambda: client.push(gradient))
                pull = median_seconds(repeats, lambda: client.pull(weights))
                rates[f"{way} push"], rates[f"{way} pull"] = N * 4 / push, N * 4 / pull
        return rates
    finally:
        ps.send_signal(signal.SIGTERM)
        ps.wait()


def cpp_rates(bin_dir, repeats):
    out = subprocess.run([os.path.join(bin_dir, "transport_bench"), f"--sizes_mib={MIB}",
                          f"--repeats={repeats}", "--tcp_seconds=0"],
                         capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.strip().startswith(f"{MIB} MiB"))
    groups = [g.split() for g in row.split("|")]
    return {"grpc push": float(groups[1][0]) * 1e9, "grpc pull": float(groups[2][0]) * 1e9,
            "shm push": float(groups[8][0]) * 1e9, "shm pull": float(groups[8][2]) * 1e9}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin_dir", default="build/bin")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    py = python_rates(args.bin_dir, args.repeats)
    cpp = cpp_rates(args.bin_dir, args.repeats)
    print(f"{MIB} MiB of float32 ({N} values), 1 shard, 1 client, median of {args.repeats}")
    print(f"{'path':<10} | {'Python GB/s':>11} | {'C++ GB/s':>9} | {'Python/C++':>10}")
    for key in ("grpc push", "grpc pull", "shm push", "shm pull"):
        print(f"{key:<10} | {py[key] / 1e9:>11.2f} | {cpp[key] / 1e9:>9.2f} | "
              f"{py[key] / cpp[key]:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
