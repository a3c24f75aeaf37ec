"""launch and experiment running Python workers and a Python evaluator (--worker_cmd,
--eval_cmd): the workers find the shards, their rank and the job's token in their environment,
a worker killed on progress is started again and resumes, a straggler plan slows one down, and
the user's own scoring code reports the accuracy the launcher stops on and summarises."""
import csv
import json
import os
import re
import subprocess
import sys

import paramserver.torch
from conftest import BIN_DIR

EXAMPLE = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../examples/pytorch/train.py"))
sys.path.insert(0, os.path.dirname(EXAMPLE))
import train as example  # noqa: E402

WORKER = f"{sys.executable} {EXAMPLE}"


def cnn_layout(tmp_path):
    path = tmp_path / "cnn.json"
    path.write_text(json.dumps(paramserver.torch.layout_of(example.SmallCnn())))
    return str(path)


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_launch_runs_python_workers_through_a_kill_with_a_straggler(tmp_path):
    token = tmp_path / "token"
    token.write_text("python-workers-token\n")
    run_dir = tmp_path / "run"
    run = subprocess.run(
        [os.path.join(BIN_DIR, "launch"), f"--model={cnn_layout(tmp_path)}", "--shards=2",
         "--workers=2", "--steps=300", "--max_seconds=0", "--optimizer=sgd", "--lr=0.05",
         f"--run_dir={run_dir}", f"--token_file={token}", "--kill=worker:1@150steps",
         "--straggler=0:2", f"--worker_cmd={WORKER}", f"--eval_cmd={WORKER} --evaluate",
         "--eval_interval_seconds=1"],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "killed worker 1 (--kill after 150 steps)" in run.stdout, run.stdout
    assert "worker 1 exited with status 137: starting it again" in run.stdout, run.stdout
    # Each worker's CSV (written by the adapter, where launch counts steps) ends at step 299;
    # the restarted worker resumed where it was (the step it was in, or the next), so its steps
    # never go back.
    for rank in (0, 1):
        steps = [int(r["step"]) for r in rows(run_dir / f"worker-{rank}.csv")]
        assert steps[-1] == 299, steps[-5:]
        assert all(b >= a for a, b in zip(steps, steps[1:])), steps
    log = (run_dir / "worker-1.log").read_text()
    assert len(re.findall(r"starting at step (\d+)", log)) == 2, log
    # The straggler plan reached worker 0 only (how much slower it ran: bench/pytorch_ddp_bench).
    assert "computing 2x slower" in (run_dir / "worker-0.log").read_text()
    assert "slower" not in log
    # The Python evaluator scored the shards' weights with the model's own code, to the end.
    evaluations = rows(run_dir / "evaluator.csv")
    assert float(evaluations[-1]["test_accuracy"]) >= 0.6, evaluations[-3:]
    assert int(evaluations[-1]["version"]) == 600, evaluations[-3:]
    assert "final test accuracy" in run.stdout
    # A model of the user's own is measured against no accuracy of this project's MLP.
    assert "0.8833" not in run.stdout and "baseline" not in run.stdout, run.stdout
    assert "baseline" not in (run_dir / "plot.gp").read_text()


def test_experiment_compares_consistency_models_on_a_pytorch_model(tmp_path):
    report = tmp_path / "report"
    run = subprocess.run(
        [os.path.join(BIN_DIR, "experiment"), f"--model={cnn_layout(tmp_path)}",
         "--modes=async,sync", "--workers=2", "--seeds=1", "--epochs=0.3", "--optimizer=sgd",
         "--lr=0.05", "--target_accuracy=0.5", f"--report_dir={report}",
         f"--worker_cmd={WORKER}", f"--eval_cmd={WORKER} --evaluate"],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = (report / "summary.md").read_text()
    for mode in ("async", "sync"):  # each reached the target (a time, not "-")
        assert re.search(rf"\| {mode}_w2 \| 1 \| [0-9.]+ ± ", summary), summary
    assert (report / "training_loss.png").exists()  # from the loss the adapter's CSV records


def test_a_layout_model_needs_the_users_commands(tmp_path):
    layout = cnn_layout(tmp_path)
    for extra, says in [((), "give --worker_cmd"),
                        ((f"--worker_cmd={WORKER}",), "give --eval_cmd")]:
        run = subprocess.run([os.path.join(BIN_DIR, "launch"), f"--model={layout}", *extra,
                              f"--run_dir={tmp_path / 'never'}"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 1 and says in run.stderr, run.stderr
        assert not (tmp_path / "never").exists()
