"""Real shards for the Python client's tests: `ps` processes on free loopback ports (the binaries
from $PS_BIN_DIR, which CTest sets), stopped with SIGTERM at the end of each test, which checks
that they exited cleanly."""
import os
import signal
import subprocess
import tempfile
import time

import pytest

BIN_DIR = os.environ.get("PS_BIN_DIR", os.path.join(os.path.dirname(__file__),
                                                    "../../build/bin"))


def _tail(path, lines=20):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def pause(process):
    """SIGSTOPs a subprocess and returns once it stopped: kill only asks, and the process's threads
    run on until each is scheduled and stops, which on a busy machine is a while."""
    process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{process.pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] in ("T", "t"):
                return
        time.sleep(0.001)


class Shards:
    """`count` shards of a job of `model` and `workers` workers, each a ps process."""

    def __init__(self, run_dir, count, model, workers, flags=(), env=None):
        self.run_dir = tempfile.mkdtemp(prefix="shards-", dir=run_dir)
        self.model = model
        self.processes, self.logs, ports = [], [], []
        for i in range(count):
            port_file = os.path.join(self.run_dir, f"port-{i}")
            log = os.path.join(self.run_dir, f"ps-{i}.log")
            argv = [os.path.join(BIN_DIR, "ps"), f"--shard_index={i}", f"--num_shards={count}",
                    f"--model={model}", f"--num_workers={workers}", "--host=127.0.0.1",
                    "--port=0", f"--port_file={port_file}", *flags]
            with open(log, "w") as out:
                self.processes.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                       env=env))
            self.logs.append(log)
            ports.append(port_file)
        deadline = time.monotonic() + 60
        self.ports = []
        for i, port_file in enumerate(ports):
            while not (os.path.exists(port_file) and open(port_file).read().strip()):
                if self.processes[i].poll() is not None:
                    raise RuntimeError(f"ps {i} exited: {_tail(self.logs[i])}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ps {i} wrote no port in 60 s: {_tail(self.logs[i])}")
                time.sleep(0.02)
            self.ports.append(int(open(port_file).read()))

    @property
    def addresses(self):
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def stop(self):
        """SIGTERM to every shard still running; their exit codes."""
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        return [p.wait(timeout=60) for p in self.processes]


@pytest.fixture
def start_shards(tmp_path):
    started = []

    def start(count, model, workers=1, flags=(), env=None):
        shards = Shards(tmp_path, count, model, workers, flags, env)
        started.append(shards)
        return shards

    yield start
    for shards in started:
        codes = shards.stop()
        assert codes == [0] * len(codes), [_tail(log) for log in shards.logs]
