"""The CUDA backend is a plugin (libparamserver_cuda.so beside the programs), so that the programs
and the C API library start where CUDA is absent: none of them needs cuBLAS or the CUDA runtime;
--device=cuda says why it cannot have a GPU (no GPU; plugin not found; plugin found but cuBLAS
not), and --device=auto falls back to the CPU and trains."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

import paramserver
from conftest import BIN_DIR

PLUGIN = os.path.join(BIN_DIR, "libparamserver_cuda.so")
CUDA_LIBRARY = re.compile(r"^lib(cublas|cublasLt|cudart|cuda)\.so")
MODEL = "mlp:784-16-10"


def needed(path):
    """The shared libraries an ELF file names in its dynamic section (NEEDED)."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", out)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def have_nvidia_driver():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def needs_plugin():
    if not os.path.exists(PLUGIN):
        pytest.skip("built without nvcc: no CUDA plugin")


def run_worker(worker, shards, device, steps=0, csv=None):
    argv = [worker, f"--ps={shards.addresses}", f"--model={MODEL}", f"--device={device}",
            f"--steps={steps}", "--rank=0", "--num_workers=1"]
    if csv:
        argv.append(f"--csv={csv}")
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_only_the_plugin_needs_cuda_libraries():
    library = os.path.join(os.path.dirname(paramserver.__file__), "libparamserver_c.so")
    # Every program of build/bin (daemons, tools, benchmarks, tests) but the plugin itself and
    # cuda_backend_test, which links the backend to check its math.
    checked = [os.path.join(BIN_DIR, name) for name in sorted(os.listdir(BIN_DIR))
               if name not in ("libparamserver_cuda.so", "cuda_backend_test")]
    checked = [path for path in checked if os.path.isfile(path) and is_elf(path)] + [library]
    assert {"ps", "worker", "evaluator", "launch", "experiment", "psctl", "export_model"} <= \
        {os.path.basename(path) for path in checked}
    linking = {path: cuda for path in checked
               if (cuda := [lib for lib in needed(path) if CUDA_LIBRARY.match(lib)])}
    assert linking == {}
    if os.path.exists(PLUGIN):
        assert any(lib.startswith("libcublas.so.") for lib in needed(PLUGIN)), needed(PLUGIN)


def test_device_cuda_without_a_gpu_says_so(start_shards):
    needs_plugin()
    if have_nvidia_driver():
        pytest.skip("an NVIDIA driver is installed: a GPU may be usable")
    shards = start_shards(1, MODEL)
    run = run_worker(os.path.join(BIN_DIR, "worker"), shards, "cuda")
    assert run.returncode == 1, run.stderr
    assert "worker: no CUDA device: the driver reports none" in run.stderr, run.stderr


def test_device_cuda_names_a_missing_plugin_and_auto_trains_on_the_cpu(start_shards, tmp_path):
    worker = shutil.copy(os.path.join(BIN_DIR, "worker"), tmp_path)
    plugin = os.path.join(tmp_path, "libparamserver_cuda.so")
    shards = start_shards(1, MODEL)
    run = run_worker(worker, shards, "cuda")
    assert run.returncode == 1, run.stderr
    if os.path.exists(PLUGIN):
        assert f"--device=cuda: cannot load the CUDA backend {plugin}: " in run.stderr, run.stderr
        assert "No such file or directory" in run.stderr, run.stderr
    else:
        assert "this build has no CUDA backend" in run.stderr, run.stderr
    csv = tmp_path / "worker.csv"
    run = run_worker(worker, shards, "auto", steps=20, csv=csv)
    assert run.returncode == 0, run.stderr
    assert "using the CPU backend" in run.stderr, run.stderr
    assert len(csv.read_text().splitlines()) == 1 + 20  # a header, a row per step


def test_device_cuda_without_cublas_says_what_to_install(start_shards, tmp_path):
    needs_plugin()
    worker = shutil.copy(os.path.join(BIN_DIR, "worker"), tmp_path)
    # The plugin as on a machine without cuBLAS: the library's name (its NEEDED entry and the
    # symbol versions named after it) renamed to one that does not exist, of the same length, so
    # that the ELF file stays valid.
    cublas = next(lib for lib in needed(PLUGIN) if lib.startswith("libcublas.so."))
    absent = cublas.replace("libcublas", "libabsent")
    plugin = tmp_path / "libparamserver_cuda.so"
    plugin.write_bytes(open(PLUGIN, "rb").read().replace(cublas.encode() + b"\0",
                                                         absent.encode() + b"\0"))
    assert absent in needed(plugin) and cublas not in needed(plugin)
    shards = start_shards(1, MODEL)
    run = run_worker(worker, shards, "cuda:0")
    assert run.returncode == 1, run.stderr
    assert f"--device=cuda:0: cannot load the CUDA backend {plugin}: {absent}: cannot open " \
        in run.stderr, run.stderr
    major = cublas.rsplit(".", 1)[1]
    assert f"install the CUDA {major} toolkit's cuBLAS ({cublas})" in run.stderr, run.stderr
