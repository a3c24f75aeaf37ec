#!/usr/bin/env python3
"""A scaling model of this parameter server (docs/scaling.md): step time, updates/s and
staleness from the model size, W, S, per-host bandwidth and latency, compute time per step and
its spread. Two uses:

  validate: beside wan_bench's measurements (bench/wan_bench.cc, emulated hosts). The model's two
            software constants per direction (a fixed cost per call and a byte rate) are fitted
            on the 0 ms async runs only; every other run is a prediction.
      python3 bench/scaling_model.py validate wan_small.json wan_large.json

  predict:  a ResNet-50-sized model (25.6M parameters) on 64, 256 and 1,024 GPU workers over 100
            and 400 Gbit/s links: shards needed, step time and scaling efficiency, next to what
            BytePS and Horovod publish.
      python3 bench/scaling_model.py predict
"""
import argparse
import json
import math
import random
import sys


def expected_max(w, mean, sd, samples=20000, seed=1):
    """E[max of w normal compute times]: the barrier a sync round waits for."""
    if w <= 1 or sd <= 0:
        return mean
    rng = random.Random(seed)
    total = 0.0
    for _ in range(samples // max(1, w // 64)):
        total += max(rng.gauss(mean, sd) for _ in range(w))
    return total / (samples // max(1, w // 64))


class Model:
    """Everything in seconds and bytes.

    A worker's step, without prefetch: pull (all shards at once) -> compute -> push (all shards).
    One call of `nbytes` on the worker's side (its link carries the whole model; the S shards each
    serve nbytes/S at once):
        t_call = o + 2 L + nbytes / B + nbytes / G
    o: fixed software cost of a call; 2 L: the request out and the answer back; B: the link;
    G: the software's byte rate (serialisation, copies, checks, the apply). Under BBR congestion
    control (`paced`), a burst is paced over about one one-way delay, so the transfer term is
    max(nbytes / B, L) (measured: a raw TCP reply of 220 KB or 1 MB at 20 ms one way takes
    61 ms, 100 bytes 41 ms).
    async:  T = C + t_pull + t_push,  at least W * nbytes / (S * B) (a shard's link, shared by W);
            while a worker's call moves its bytes, the other W - 1 workers' calls of the same
            direction share the shards' links with it as often as their phases overlap, which
            stretches n / B to n k / (S B), k = 1 + (W - 1) t / T (predict, solved for T)
    sync:   T = E[max of W compute times] + t_pull + t_push  (a round waits for its slowest;
            its W pulls and W pushes reach a shard's link at once: each at least W n / (S B))
    How the step's communication is scheduled (wan_bench --schedules) changes C + t_pull + t_push:
    overlap:  forward (1/3 of C for dense layers) starts each layer once its weights are in:
              the pull's parts share the worker's link and arrive S at a time (one per host;
              K shards per host go one after another), each from its start, so forward goes
              through the first part of each round as it comes and the others' once the round
              is in (forward_end); backward (2/3 of C) then makes the
              gradient final from the last parameter to the first at an even rate, and the push
              goes 1 MiB piece by piece as backward makes them, one after another on the
              worker's link (push_end).
    prefetch: the next step's pull runs during this one's compute and push (the other direction
              of a full-duplex link): T = max(C + t_push, t_pull).
    overlap+prefetch: max(push_end, t_pull).
    Updates/s per shard: W / T (async), 1 / T (sync).
    Staleness (async): the other W - 1 workers apply at (W - 1) / T, during the time from a pull's
    snapshot to the push's apply, T minus the answer's and the next request's trips (2 L):
        E[staleness] = (W - 1) (T - 2 L) / T;  sync: 0.
    """

    def __init__(self, o_pull, g_pull, o_push, g_push):
        self.o_pull, self.g_pull, self.o_push, self.g_push = o_pull, g_pull, o_push, g_push

    def call(self, o, g, nbytes, link, latency, paced, share=1.0):
        """`share`: how many times the worker's own link the transfer takes, at least 1 (a
        shard's link that other workers' calls share, see predict)."""
        transfer = max(1.0, share) * nbytes / link
        return o + 2 * latency + max(transfer, latency if paced else 0) + nbytes / g

    def predict(self, mode, params, elem_bytes, workers, shards, link, latency, compute,
                compute_sd, paced=False, schedule="serial", per_host=1):
        """`shards`: the shards' hosts, each with its link; `per_host`: shards on each of them
        (wan_bench --shards_per_host), whose parts of a pull go one after another."""
        nbytes = params * elem_bytes
        pull = self.call(self.o_pull, self.g_pull, nbytes, link, latency, paced)
        push = self.call(self.o_push, self.g_push, nbytes, link, latency, paced)
        if mode == "sync":
            # A round's W pulls and W pushes reach each shard's link at once.
            bound = workers * nbytes / (shards * link)
            pull, push = max(pull, bound), max(push, bound)
            step = expected_max(workers, compute, compute_sd) + pull + push
            updates, staleness = 1 / step, 0.0
        else:
            # The shards' links are shared (processor sharing): while a worker pulls, each of the
            # W - 1 others pulls a fraction pull / T of the time (independent phases), so each
            # shard's link carries k = 1 + (W - 1) pull / T pulls at once, each at link / k, and
            # the worker's S streams take k / S of its own link's time. Likewise pushes. A fixed
            # point in T, damped.
            pieces = pieces_of(nbytes, shards * per_host)
            step = scheduled_step(schedule, compute, pull, push, shards, pieces, per_host)
            for _ in range(200):
                def share(t):
                    return (1 + (workers - 1) * min(1.0, t / step)) / shards
                pull = self.call(self.o_pull, self.g_pull, nbytes, link, latency, paced,
                                 share(pull))
                push = self.call(self.o_push, self.g_push, nbytes, link, latency, paced,
                                 share(push))
                step = 0.5 * step + 0.5 * scheduled_step(schedule, compute, pull, push, shards,
                                                         pieces, per_host)
            step = max(step, workers * nbytes / (shards * link))
            updates = workers / step
            staleness = (workers - 1) * max(0.0, step - 2 * latency) / step
        return {"step": step, "pull": pull, "push": push, "updates": updates,
                "staleness": staleness}


PIECE_BYTES = 1 << 20  # what a push sent as backward makes it goes in (worker --overlap)


def pieces_of(nbytes, shards):
    """The pieces an overlapping worker's push goes in: 1 MiB each, at least one per shard."""
    return max(shards, math.ceil(nbytes / PIECE_BYTES))


def forward_end(compute, pull, shards, per_host=1):
    """When an overlapping step's forward pass (a third of `compute`) ends, from the step's start:
    the pull's parts share the worker's link, one per host at a time (`per_host` parts each, one
    after another), each from its start, so the pass keeps up with the first of each round of
    `shards` parts and does the others' layers once that round is in: at the end, the last
    round's other parts, (shards - 1) / (shards * per_host) of the model."""
    forward = compute / 3
    return max(forward, pull + forward * (shards - 1) / (shards * per_host))


def push_end(start, compute, push, pieces):
    """When a push whose `pieces` go as backward makes them final ends: backward (two thirds of
    `compute`) runs from `start` and finishes piece k (the last first) at start + backward (k + 1)
    / pieces; each piece then takes push / pieces on the link, in turn."""
    backward = 2 * compute / 3
    end = start
    for k in range(pieces):
        end = max(end, start + backward * (k + 1) / pieces) + push / pieces
    return end


def scheduled_step(schedule, compute, pull, push, shards, pieces, per_host=1):
    """A worker's step time (no link shared with others) under a wan_bench --schedules entry."""
    if schedule == "serial":
        return compute + pull + push
    if schedule == "overlap":
        return push_end(forward_end(compute, pull, shards, per_host), compute, push, pieces)
    if schedule == "prefetch":
        return max(compute + push, pull)
    if schedule == "overlap+prefetch":
        return max(push_end(compute / 3, compute, push, pieces), pull)
    raise ValueError("unknown schedule " + schedule)


def link_of(runs, run):
    """B of a run: at 20 ms a 3 s iperf3 is still ramping up, so the link is the best iperf3
    measured at the same rate (the one without delay)."""
    return max(x["tcp_gbs"] for x in runs if x["rate_gbit"] == run["rate_gbit"]) * 1e9


def fit(runs):
    """o and G per direction from the 0 ms async runs of W = 2 (least squares on
    t - nbytes/B = o + nbytes/G)."""
    calib = [r for r in runs if r["latency_ms"] == 0 and r["mode"] == "async" and r["workers"] == 2
             and r.get("schedule", "serial") == "serial"]
    if len({r["params"] for r in calib}) < 2:
        sys.exit("validate needs 0 ms async runs of two model sizes to fit the model on")
    out = []
    for key in ("pull_ms", "push_ms"):
        xs = [r["params"] * 4 for r in calib]
        ys = [r[key] / 1000 - r["params"] * 4 / link_of(runs, r) for r in calib]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        o = max(0.0, my - slope * mx)
        out += [o, 1 / slope if slope > 0 else math.inf]
    return Model(*out)


def validate(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            runs += json.load(f)
    model = fit(runs)
    print("fitted on the 0 ms async runs: pull o = %.2f ms, G = %.2f GB/s; push o = %.2f ms, "
          "G = %.2f GB/s" % (model.o_pull * 1e3, model.g_pull / 1e9, model.o_push * 1e3,
                             model.g_push / 1e9))
    print("link B = the 0 ms runs' iperf3 ceiling; compute C and its spread = each run's own mean "
          "and standard deviation")
    head = "%-8s %-3s %-5s %-5s %-16s | %-16s %-16s %-16s | %-15s %-15s"
    print(head % ("params", "W", "delay", "mode", "schedule", "step ms", "pull ms", "push ms",
                  "updates/s/shard", "staleness"))
    print(head % ("", "", "", "", "", "pred meas  err", "pred meas  err", "pred meas  err",
                  "pred meas  err", "pred meas  err"))
    errors = {}
    for r in sorted(runs, key=lambda r: (r["params"], r["workers"], r["latency_ms"], r["mode"])):
        link = link_of(runs, r)
        schedule = r.get("schedule", "serial")
        # A run's compute C: what its worker CSVs say a step computed (with overlap, the step's
        # time less its waits, which holds the sends' own CPU time; the serial runs' figure is
        # the one without).
        p = model.predict(r["mode"], r["params"], 4, r["workers"], r["shards"], link,
                          r["latency_ms"] / 1000, r["compute_ms"] / 1000,
                          r["compute_sd_ms"] / 1000, r.get("tcp_congestion_control") == "bbr",
                          schedule, r.get("shards_per_host", 1))
        fitted = (r["latency_ms"] == 0 and r["mode"] == "async" and r["workers"] == 2
                  and schedule == "serial")

        def cell(name, pred, meas, fmt="%5.1f"):
            if schedule != "serial" and name in ("pull", "push", "staleness"):
                return "%-16s" % "-"  # waits, not calls; staleness not modelled there
            if meas == 0:
                return (fmt + " " + fmt + "     ") % (pred, meas)
            err = (pred - meas) / meas
            if not fitted:
                errors.setdefault(name, []).append(abs(err))
            return (fmt + " " + fmt + " %+4.0f%%") % (pred, meas, 100 * err)

        print(head % (r["params"], r["workers"], "%g" % r["latency_ms"], r["mode"], schedule,
                      cell("step time", p["step"] * 1e3, r["step_ms"]),
                      cell("pull", p["pull"] * 1e3, r["pull_ms"]),
                      cell("push", p["push"] * 1e3, r["push_ms"]),
                      cell("updates/s", p["updates"], r["updates_per_s"], "%5.0f"),
                      cell("staleness", p["staleness"], r["staleness_mean"], "%5.2f")))
    print("pull, push: the calls' times (a run that overlaps them waits less; not compared)")
    print("predictions (every run but the fitted ones):")
    for name, errs in errors.items():
        errs.sort()
        print("  %-10s median error %3.0f%%, largest %3.0f%%, %d of %d within 15%%"
              % (name, 100 * errs[len(errs) // 2], 100 * errs[-1], sum(e <= 0.15 for e in errs),
                 len(errs)))


def predict(args):
    """The model at datacenter scale: each worker reaches its S shards over min(S, cores)
    connections at g bytes/s each (the software rate measured here), through a link of B; each
    shard takes W x nbytes / S per step through its link and its apply threads. Efficiency under
    each schedule (scheduled_step)."""
    nbytes = args.params * args.elem_bytes
    compute = args.compute_ms / 1000
    latency = args.latency_us * 1e-6
    print("ResNet-50-sized model: %.1fM parameters, %s on the wire (%.0f MB per push and per "
          "pull); compute %.0f ms per step (batch 256 on one GPU), spread %.0f%%; one-way latency "
          "%g us; per-connection rate %.2f (push) / %.2f (pull) GB/s, %d connections per worker "
          "at once; apply %.2f GB/s per thread, %d threads per shard"
          % (args.params / 1e6, args.wire, nbytes / 1e6, args.compute_ms, 100 * args.spread,
             args.latency_us, args.g_push, args.g_pull, args.worker_cores, args.apply_gbs,
             args.apply_threads))
    head = "%-5s %-8s | %-6s %-8s %-8s %-8s | %-7s %-8s %-8s %-8s %-8s | %-10s %-9s | %s"
    print(head % ("W", "link", "shards", "step ms", "pull ms", "push ms", "serial", "prefetch",
                  "overlap", "both", "line rate", "sync wait", "staleness", "bound by"))
    for gbit in args.links:
        link = gbit / 8 * 1e9
        shard_rate = min(link, args.apply_threads * args.apply_gbs * 1e9)
        for workers in args.workers:
            def timing(shards, schedule="serial"):
                streams = min(shards, args.worker_cores)
                pull = args.o_ms / 1000 + 2 * latency + nbytes / min(link, streams * args.g_pull * 1e9)
                push = args.o_ms / 1000 + 2 * latency + nbytes / min(link, streams * args.g_push * 1e9)
                shard_bound = workers * nbytes / (shards * shard_rate)
                step = scheduled_step(schedule, compute, pull, push, shards,
                                      pieces_of(nbytes, shards))
                return max(step, shard_bound), pull, push, streams
            # The fewest shards within 1% of the best step time of the fastest schedule.
            def fastest(k):
                return timing(k, "overlap+prefetch")[0]
            best = min(fastest(k) for k in range(1, 4 * workers + 1))
            shards = next(k for k in range(1, 4 * workers + 1) if fastest(k) <= 1.01 * best)
            step, pull, push, streams = timing(shards)
            efficiency = {x: "%.0f%%" % (100 * compute / timing(shards, x)[0])
                          for x in ("serial", "prefetch", "overlap", "overlap+prefetch")}
            barrier = expected_max(workers, compute, args.spread * compute, samples=4000) - compute
            bound = ("the link" if link <= streams * args.g_push * 1e9
                     else "the connections' software rate")
            print(head % (workers, "%d Gb/s" % gbit, shards, "%.1f" % (step * 1e3),
                          "%.1f" % (pull * 1e3), "%.1f" % (push * 1e3), efficiency["serial"],
                          efficiency["prefetch"], efficiency["overlap"],
                          efficiency["overlap+prefetch"],
                          "%.0f%%" % (100 * compute / (compute + 2 * (nbytes / link + 2 * latency))),
                          "+%.0f ms" % (barrier * 1e3),
                          "%.0f" % ((workers - 1) * (step - 2 * latency) / step), bound))
    print("efficiency: compute / step time (1 = linear scaling), for each schedule of a step's "
          "communication (worker --prefetch, --overlap, both). Step, pull and push: serial. Line "
          "rate: serial, were a worker's connections as fast as its link. Published for "
          "ResNet-50: BytePS ~90% at 256 GPUs, Horovod ~90% at 512 GPUs (both overlap).")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="predictions beside wan_bench --json files")
    v.add_argument("json", nargs="+")
    p = sub.add_parser("predict", help="a ResNet-50-sized job on 64-1,024 GPU workers")
    p.add_argument("--params", type=float, default=25.6e6)
    p.add_argument("--wire", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compute_ms", type=float, default=85.0,
                   help="one step on one GPU (H100, batch 256, mixed precision: ~3,000 images/s)")
    p.add_argument("--spread", type=float, default=0.05, help="compute time's sd / mean")
    p.add_argument("--latency_us", type=float, default=10.0)
    p.add_argument("--links", type=int, nargs="+", default=[100, 400])
    p.add_argument("--workers", type=int, nargs="+", default=[64, 256, 1024])
    # Measured on this project's development machine (bench/RESULTS.md, "Bulk data plane"): one
    # data-plane connection pushes 2.38 GB/s and pulls 3.03 GB/s (transport_bench, 38 MiB, the
    # lower of two loaded runs; gRPC's streams: 0.69 / 1.13); a shard applies pushes at 1.88 GB/s
    # per thread (the in-process push); a call's fixed cost, fitted by `validate`.
    p.add_argument("--g_push", type=float, default=2.38, help="GB/s of one push connection")
    p.add_argument("--g_pull", type=float, default=3.03, help="GB/s of one pull connection")
    p.add_argument("--apply_gbs", type=float, default=1.88, help="GB/s of one apply thread")
    p.add_argument("--apply_threads", type=int, default=8, help="apply threads per shard")
    p.add_argument("--worker_cores", type=int, default=8,
                   help="connections a worker drives at once")
    p.add_argument("--o_ms", type=float, default=0.1,
                   help="fixed cost of a call (validate fits 0 here: below its resolution)")
    args = parser.parse_args()
    if args.command == "validate":
        validate(args.json)
    else:
        args.elem_bytes = 4 if args.wire == "fp32" else 2
        predict(args)


if __name__ == "__main__":
    main()
