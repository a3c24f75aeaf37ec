"""What a new user meets first, against real shards: a model of another layout refused naming the
tensor that differs, export_model told which model to pass, statistics with numbers as numbers,
the library's log lines in Python's logging, and a wrong address that fails soon and quietly."""
import json
import logging
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import paramserver
from conftest import BIN_DIR

SHARDS_LAYOUT = {"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
                             {"name": "conv1.bias", "shape": [16]},
                             {"name": "fc.weight", "shape": [10, 16]}]}


def layout_file(tmp_path, layout):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(layout))
    return str(path)


def test_a_layout_mismatch_names_the_first_tensor_that_differs(start_shards, tmp_path):
    shards = start_shards(2, layout_file(tmp_path, SHARDS_LAYOUT))
    narrower = {"tensors": [{"name": "conv1.weight", "shape": [6, 1, 5, 5]},
                            {"name": "conv1.bias", "shape": [6]},
                            {"name": "fc.weight", "shape": [10, 16]}]}
    reordered = {"tensors": [SHARDS_LAYOUT["tensors"][1], SHARDS_LAYOUT["tensors"][0],
                             SHARDS_LAYOUT["tensors"][2]]}  # the same size: only the order
    for layout, says in [
            (narrower, "the shards' model has conv1.weight [16,1,5,5] at position 0 where this "
                       "client's has conv1.weight [6,1,5,5]"),
            (reordered, "the shards' model has conv1.weight [16,1,5,5] at position 0 where this "
                        "client's has conv1.bias [16]")]:
        with paramserver.Client(ps=shards.addresses, model=layout, rank=0,
                                num_workers=1) as client:
            with pytest.raises(paramserver.FailedPrecondition) as refused:
                client.register()
            assert "model mismatch" in str(refused.value) and says in str(refused.value), \
                str(refused.value)
    # Shards of one of this project's networks: its tensors, as named in export files.
    mlp = start_shards(1, "mlp:784-32-10")
    wider = {"tensors": [{"name": "fc1.weight", "shape": [784, 64]},
                         {"name": "fc1.bias", "shape": [64]}]}
    with paramserver.Client(ps=mlp.addresses, model=wider, rank=0, num_workers=1) as client:
        with pytest.raises(paramserver.FailedPrecondition,
                           match=r"the shards' model has fc1.weight \[784,32\] at position 0 "
                                 r"where this client's has fc1.weight \[784,64\]"):
            client.register()


def test_export_model_of_a_layout_job_says_to_pass_the_layout(start_shards, tmp_path):
    shards = start_shards(1, layout_file(tmp_path, SHARDS_LAYOUT))
    run = subprocess.run([os.path.join(BIN_DIR, "export_model"), f"--ps={shards.addresses}",
                          f"--out={tmp_path / 'model.safetensors'}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the job's model is a tensor layout, pass it as --model=FILE.json" in run.stderr, \
        run.stderr


def test_statistics_give_numbers_as_numbers(start_shards):
    shards = start_shards(2, "flat:100", flags=("--optimizer=sgd", "--lr=0.5"))
    with paramserver.Client(ps=shards.addresses, model="flat:100", rank=0,
                            num_workers=1) as client:
        client.register()
        client.initialize(np.zeros(100, np.float32))
        for _ in range(3):
            client.pull(np.empty(100, np.float32))
            client.push(np.ones(100, np.float32))
        stats = client.stats()
    assert len(stats) == 2
    for shard in stats:
        # 64-bit fields (which protobuf's JSON writes as strings) and 32-bit ones alike.
        assert shard["version"] == 3 and shard["registered_workers"] == 1, shard
        assert shard["pushes_applied"] == 3 and shard["end"] > shard["begin"], shard
        assert shard["staleness_counts"][0] == 3, shard
        assert shard["workers"][0]["pushes_applied"] == 3, shard
        assert shard["consistency"] == "async" and shard["model_fingerprint"] == "flat:100"
    numbers = [v for shard in stats for v in shard.values() if not isinstance(v, (str, list))]
    assert all(isinstance(v, (int, float, bool)) for v in numbers), stats
    strings = {k for shard in stats for k, v in shard.items() if isinstance(v, str)}
    assert strings <= {"model_fingerprint", "optimizer", "consistency", "checkpoint_last_error",
                       "replica_role", "release", "version_line"}, strings
    line = paramserver._native.lib.ps_version().decode()  # this build's, as --version prints it
    assert all(shard["version_line"] == line for shard in stats), stats


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append((record.levelno, record.getMessage()))


def test_the_librarys_log_lines_go_to_the_paramserver_logger(start_shards, capfd):
    shards = start_shards(2, "flat:100")
    logger = logging.getLogger("paramserver")
    records = Records()
    logger.addHandler(records)
    level = logger.level
    try:
        logger.setLevel(logging.INFO)
        with paramserver.Client(ps=shards.addresses, model="flat:100", rank=0) as client:
            client.register()  # one line per shard: the path its tensors take
        said = [m for lv, m in records.messages if lv == logging.INFO and "tensors" in m]
        assert sorted(m.split(" (")[0] for m in said) == ["shard 0", "shard 1"], records.messages
        records.messages.clear()
        logger.setLevel(logging.WARNING)  # as an application quiets them
        with paramserver.Client(ps=shards.addresses, model="flat:100", rank=0) as client:
            client.register()
        assert records.messages == []
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    # None of it went around logging to the process's stderr.
    assert "tensors" not in capfd.readouterr().err


def closed_port():
    with socket.socket() as s:  # bound, never listening, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_wrong_address_fails_soon_with_a_clear_message_and_few_lines(tmp_path):
    # A fresh interpreter, as a user's script, with the client's defaults (no retry_seconds) and
    # no logging configured: what reaches its stderr is what the user sees.
    script = tmp_path / "wrong_address.py"
    script.write_text(f"""
import paramserver
try:
    paramserver.Client(ps="127.0.0.1:{closed_port()},127.0.0.1:{closed_port()}",
                       model="flat:100", rank=0).register()
except paramserver.Unavailable as e:
    print("refused:", e)
""")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("refused: shard 0 (127.0.0.1:"), run.stdout
    assert "nothing listens" in run.stdout and "of retries" in run.stdout, run.stdout
    # The first failure of each shard, and at most one more line each while it retried (121 lines
    # in a minute before).
    lines = run.stderr.splitlines()
    assert 2 <= len(lines) <= 4, run.stderr
    assert all("retrying for up to 10s" in line for line in lines), run.stderr
