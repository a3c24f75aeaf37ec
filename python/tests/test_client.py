"""The Python client against real shards: zero-copy buffers, asynchronous handles, heartbeats and
Leave, credentials, and bad input that raises and changes no weight."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import paramserver
from conftest import pause
from paramserver import Client

N = 1000
SGD = ("--optimizer=sgd", "--lr=0.5")


def weights(shards, n=N):
    """The shards' weights, as an observer reads them."""
    with Client(ps=shards.addresses, model=shards.model) as observer:
        out = np.empty(n, np.float32)
        observer.pull(out)
        return out


def worker(shards, rank=0, **settings):
    settings.setdefault("num_workers", 1)
    return Client(ps=shards.addresses, model=shards.model, rank=rank, **settings)


def test_pull_writes_and_push_reads_the_callers_memory_in_place(start_shards):
    shards = start_shards(2, f"flat:{N}", flags=SGD)
    with worker(shards) as client:
        assert client.register() == 0
        assert client.num_shards == 2 and client.total_params == N
        assert client.initialize(np.arange(N, dtype=np.float32)) == 2
        # A NumPy array over a bytearray: the pull lands in the bytearray itself.
        raw = bytearray(4 * N)
        assert client.pull(np.frombuffer(raw, dtype=np.float32)) == [0, 0]
        assert np.array_equal(np.frombuffer(raw, dtype=np.float32), np.arange(N))
        # A torch tensor that is a view at an offset into a larger storage: its own elements only.
        storage = torch.full((3 * N,), 7.0)
        view = storage[N:2 * N]
        before = view.data_ptr()
        client.pull(view)
        assert view.data_ptr() == before
        assert torch.equal(view, torch.arange(N, dtype=torch.float32))
        assert torch.all(storage[:N] == 7) and torch.all(storage[2 * N:] == 7)
        # A push from a view: w -= 0.5 * g on both shards.
        storage[N:2 * N] = 2.0
        summary = client.push(view)
        assert summary.sequence == 0 and summary.duplicates == 0 and summary.dropped == 0
        assert np.array_equal(weights(shards), np.arange(N, dtype=np.float32) - 1.0)
        # A plain writable buffer of floats works too.
        floats = memoryview(bytearray(4 * N)).cast("f")
        client.pull(floats)
        assert floats[5] == 4.0


def test_asynchronous_handles_overlap_and_keep_their_buffers(start_shards):
    shards = start_shards(2, f"flat:{N}", flags=SGD)
    with worker(shards) as client:
        client.register()
        client.initialize(np.zeros(N, np.float32))
        w = np.empty(N, np.float32)
        client.pull(w)
        versions = [0, 0]
        for step in range(20):
            push = client.push_async(np.ones(N, np.float32))  # the array lives in the handle
            pull = client.pull_async(w, prefetch=True)
            summary = push.wait()
            assert summary.sequence == step
            # Computed from weights pulled while the previous push was in flight: at most 1.
            assert summary.max_staleness <= 1
            versions = pull.wait()
            assert pull.done() and pull.wait() == versions  # a result is kept
            assert versions[0] in (step, step + 1)
        assert client.pull(w) == [20, 20]
        assert np.all(w == -10.0)


def test_bad_input_raises_a_clear_error_and_changes_no_weight(start_shards):
    shards = start_shards(2, f"flat:{N}", flags=SGD)
    client = worker(shards)
    client.register()
    client.initialize(np.arange(N, dtype=np.float32))
    before = weights(shards)
    bad = {
        "float64": (np.ones(N), "dtype float64"),
        "int tensor": (torch.ones(N, dtype=torch.int32), "dtype torch.int32"),
        "short": (np.ones(N - 1, np.float32), f"has {N - 1} values; the model has {N}"),
        "long tensor": (torch.ones(N + 1), f"has {N + 1} values"),
        "strided": (np.ones(2 * N, np.float32)[::2], "not C-contiguous"),
        "transposed": (torch.ones(N // 10, 10).t(), "not contiguous"),
        "list": ([1.0] * N, "must be a NumPy array, a torch tensor or a buffer"),
        "NaN": (np.full(N, np.nan, np.float32), "not finite"),
        "Inf": (np.full(N, np.inf, np.float32), "not finite"),
    }
    for name, (gradient, message) in bad.items():
        with pytest.raises(paramserver.InvalidArgument, match=message):
            client.push(gradient)
    read_only = np.empty(N, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        client.pull(read_only)
    with pytest.raises(paramserver.InvalidArgument, match="dtype float64"):
        client.pull(np.empty(N))
    with pytest.raises(paramserver.InvalidArgument):
        client.initialize(np.ones(N + 5, np.float32))
    assert np.array_equal(weights(shards), before)
    stats = client.stats()
    assert [s["version"] for s in stats] == [0, 0]
    assert sum(s["pushes_rejected"] for s in stats) >= 2  # the NaN and Inf pushes
    client.close()
    client.close()  # idempotent
    for call in (lambda: client.pull(np.empty(N, np.float32)),
                 lambda: client.push(np.ones(N, np.float32)), client.register, client.stats):
        with pytest.raises(paramserver.FailedPrecondition, match="the client is closed"):
            call()
    assert np.array_equal(weights(shards), before)


def test_an_observer_pulls_but_cannot_push(start_shards):
    shards = start_shards(1, f"flat:{N}")
    with worker(shards) as w:
        w.register()
        w.initialize(np.ones(N, np.float32))
    with Client(ps=shards.addresses, model=f"flat:{N}") as observer:
        observer.register()
        assert observer.rank == -1
        with pytest.raises(paramserver.FailedPrecondition, match="observer"):
            observer.push(np.ones(N, np.float32))
        out = np.empty(N, np.float32)
        observer.pull(out)
        assert np.all(out == 1.0)


def test_a_token_protected_job_refuses_a_client_without_its_token(start_shards, tmp_path,
                                                                  monkeypatch):
    monkeypatch.delenv("PS_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-this-job-0123456789\n")
    os.chmod(token, 0o600)
    shards = start_shards(1, f"flat:{N}", flags=(f"--token_file={token}",))
    with worker(shards, retry_seconds=0) as stranger:
        with pytest.raises(paramserver.Unauthenticated, match="token"):
            stranger.register()
    wrong = tmp_path / "wrong"
    wrong.write_text("another-jobs-token-0123456789abcdef\n")
    os.chmod(wrong, 0o600)
    with worker(shards, token_file=str(wrong), retry_seconds=0) as impostor:
        with pytest.raises(PermissionError):
            impostor.register()
    with worker(shards, token_file=str(token)) as member:
        member.register()
        assert member.initialize(np.ones(N, np.float32)) == 1


def test_heartbeats_keep_a_worker_active_and_close_leaves(start_shards):
    shards = start_shards(1, f"flat:{N}", flags=("--lease_seconds=1",))
    with Client(ps=shards.addresses, model=f"flat:{N}") as observer:
        def active():
            return [w["active"] for w in observer.stats()[0].get("workers", [])]

        client = worker(shards, heartbeat_seconds=0.2)
        client.register()
        time.sleep(2.5)  # past the lease: only heartbeats keep it active
        assert active() == [True]
        client.close()  # leaves
        assert active() == [False]


def test_a_cluster_spec_names_the_shards_model_and_credentials(start_shards, tmp_path):
    shards = start_shards(2, "mlp:784-8-10", workers=2)
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"shards": shards.addresses.split(","), "workers": 2,
                                "model": "mlp:784-8-10"}))
    with Client(cluster=str(spec), rank=1) as client:
        assert client.register() == 0
        assert client.total_params == 784 * 8 + 8 + 8 * 10 + 10
    with pytest.raises(paramserver.InvalidArgument, match="unknown setting"):
        Client(cluster=str(spec), rank=1, batch_size=3)
    with pytest.raises(paramserver.InvalidArgument, match="no shards"):
        Client(model="flat:4")
    with pytest.raises(paramserver.InvalidArgument, match="no model"):
        Client(ps="127.0.0.1:1")
    with pytest.raises(paramserver.InvalidArgument, match="push_dtype"):
        Client(ps="127.0.0.1:1", model="flat:4", push_dtype="float8")
    with pytest.raises(paramserver.InvalidArgument, match="compress: unknown compression"):
        Client(ps="127.0.0.1:1", model="flat:4", compress="int4")
    with pytest.raises(paramserver.InvalidArgument, match="pull_compress: unknown compression"):
        Client(ps="127.0.0.1:1", model="flat:4", pull_compress="int4")
    with pytest.raises(paramserver.Error, match="cluster spec"):
        Client(cluster=str(tmp_path / "missing.json"))


@pytest.mark.parametrize("settings", [{"shared_memory": False},
                                      {"shared_memory": False, "data_plane": False},
                                      {"shared_memory": True},
                                      {"push_dtype": "bf16", "pull_dtype": "fp16"},
                                      {"compress": "onebit"}, {"compress": "topk:1"}])
def test_every_transport_and_wire_type_moves_the_same_values(start_shards, settings):
    shards = start_shards(2, f"flat:{N}", flags=SGD)
    with worker(shards, **settings) as client:
        client.register()
        client.initialize(np.full(N, 1.0, np.float32))
        client.push(np.full(N, 0.5, np.float32))
        out = np.empty(N, np.float32)
        assert client.pull(out) == [1, 1]
        assert np.all(out == 0.75)


def test_compressed_pulls_bring_the_change_since_the_last_pull(start_shards):
    shards = start_shards(2, f"flat:{N}", flags=SGD)
    with worker(shards, compress="topk:1", pull_compress="int8") as client:
        client.register()
        client.initialize(np.linspace(-1, 1, N, dtype=np.float32))
        out = np.empty(N, np.float32)
        client.pull(out)
        assert np.array_equal(out, np.linspace(-1, 1, N, dtype=np.float32)), "the first is whole"
        gradient = np.linspace(0, 0.5, N, dtype=np.float32)
        client.push(gradient)
        assert client.pull(out) == [1, 1]
        expected = np.linspace(-1, 1, N, dtype=np.float32) - 0.5 * gradient
        # int8: within half a step of 1/127 of the largest change in a block of 256
        np.testing.assert_allclose(out, expected, rtol=0, atol=0.25 / 127 / 2 + 1e-6)
        assert sum(s["compressed_pulls"] for s in client.stats()) == 2


def test_a_waited_pull_sends_the_parts_each_host_still_holds(start_shards):
    """Where hosts hold several shards (127.0.0.2 and 127.0.0.3 stand for two: the shards listen on
    every address), a started pull takes each host's parts one after another; wait() sends the
    ones still held at once, as the C++ client's Wait does."""
    n = 1 << 20
    shards = start_shards(4, f"flat:{n}", flags=("--host=0.0.0.0", "--insecure", *SGD))
    ps = ",".join(f"127.0.0.{2 + i % 2}:{port}" for i, port in enumerate(shards.ports))
    initial = np.arange(n, dtype=np.float32) % 1000
    with Client(ps=ps, model=shards.model, rank=0, num_workers=1, shared_memory=False) as client:
        client.register()
        client.initialize(initial)
        begin, end = client.shard_ranges[2]  # host a's second part, behind shard 0
        out = np.full(n, -1, np.float32)
        pause(shards.processes[0])
        try:
            handle = client.pull_async(out)
            with pytest.raises(TimeoutError):
                handle.wait_values(begin, end, timeout=2)
            with pytest.raises(TimeoutError):
                handle.wait(timeout=0.5)
            handle.wait_values(begin, end, timeout=20)  # within the client's retry budget
        finally:
            shards.processes[0].send_signal(signal.SIGCONT)
        handle.wait()
        assert np.array_equal(out, initial)


def test_a_local_exchange_trades_the_model_with_the_centre(start_shards):
    shards = start_shards(2, f"flat:{N}", workers=1, flags=("--consistency=local:2",))
    with worker(shards) as client:
        step = client.register()
        client.initialize(np.arange(N, dtype=np.float32))
        assert client.local_models
        x = np.zeros(N, np.float32)
        exchange = client.local_exchange(x)
        exchange.before_step(step)  # the first pulls the centre
        assert np.array_equal(x, np.arange(N))
        x += 1  # the local optimizer's steps
        exchange.after_step(step)  # mid-period: nothing
        exchange.before_step(step + 1)
        assert np.array_equal(weights(shards), np.arange(N))
        x += 1
        exchange.after_step(step + 1)  # the period's end: its change is the round's average
        assert np.array_equal(weights(shards), np.arange(N) + 2)
    easgd = start_shards(1, f"flat:{N}", workers=2, flags=("--consistency=easgd:1",))
    with worker(easgd, num_workers=2) as client:
        client.register()
        client.initialize(np.zeros(N, np.float32))
        x = np.zeros(N, np.float32)
        exchange = client.local_exchange(x)
        exchange.before_step(0)
        x += 1
        exchange.before_step(1)  # diff = 0.45 (x - centre), the shards' alpha (0.9 / 2 workers)
        assert np.allclose(x, 0.55) and np.allclose(weights(easgd), 0.45)
    synchronous = start_shards(1, f"flat:{N}", flags=("--consistency=sync",))
    with worker(synchronous) as client:
        client.register()
        assert not client.local_models
        with pytest.raises(paramserver.FailedPrecondition, match="no local model"):
            client.local_exchange(np.zeros(N, np.float32))


def test_a_signal_handler_can_cancel_an_exchange_that_waits_for_a_round(start_shards):
    shards = start_shards(1, f"flat:{N}", workers=2, flags=("--consistency=local:1",))
    with worker(shards, num_workers=2) as client, worker(shards, 1, num_workers=2) as other:
        client.register()
        other.register()
        client.initialize(np.zeros(N, np.float32))
        exchange = client.local_exchange(np.zeros(N, np.float32))
        exchange.before_step(0)
        exchange.after_step(0)
        previous = signal.signal(signal.SIGALRM, lambda *_: client.cancel())
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        start = time.monotonic()
        try:
            with pytest.raises(paramserver.Cancelled):
                exchange.before_step(1)  # the round waits for worker 1's change
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert time.monotonic() - start < 10


def test_a_step_sends_each_shards_part_as_its_range_becomes_final(start_shards):
    shards = start_shards(2, f"flat:{N}", flags=SGD)
    with worker(shards) as client:
        client.register()
        client.initialize(np.ones(N, np.float32))
        w, g = np.zeros(N, np.float32), np.full(N, 2, np.float32)
        step = client.step(w, g)
        step.weights_needed(0, 10)  # the first values, whatever the rest does
        assert np.array_equal(w[:10], np.ones(10))
        with pytest.raises(paramserver.FailedPrecondition, match="no push"):
            step.take_push()
        half = N // 2
        step.gradient_final(0, half)  # shard 0's range: its part goes; nothing reaches the end
        assert step.final(half - 1, half + 1) and not step.final(half, N)
        assert step.filled_from == N
        step.gradient_final(half, N)
        assert step.filled_from == 0
        assert step.take_push().wait().sequence == 0
        step.close()
        assert np.array_equal(weights(shards), np.zeros(N))  # 1 - 0.5 * 2


def test_the_package_and_its_library_name_one_release(tmp_path):
    assert paramserver.__version__ == os.environ["PS_PROJECT_VERSION"]  # CMake's project(VERSION)
    line = paramserver._native.lib.ps_version().decode()
    assert line.startswith(f"paramserver {paramserver.__version__} ("), line
    # A package beside a library of another release says so at import, naming both.
    package = os.path.dirname(paramserver.__file__)
    copy = tmp_path / "paramserver"
    shutil.copytree(package, copy)
    (copy / "_version.py").write_text('__version__ = "0.0.1"\n')
    result = subprocess.run([sys.executable, "-c", "import paramserver"], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                            timeout=60)
    assert result.returncode != 0
    assert (f"is {line}, this Python package is paramserver 0.0.1: install the package and "
            "library of one release") in result.stderr, result.stderr
