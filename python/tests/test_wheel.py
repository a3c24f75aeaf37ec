"""The pip wheel ($PS_WHEEL, the `wheel` build target) installed into a fresh virtualenv of this
Python with --system-site-packages (Debian's python3-torch): run from a directory outside the
source and build trees with no PYTHONPATH or LD_LIBRARY_PATH, the package and every library it
loads come from the venv (but glibc and the C++ runtime), and two workers of the venv's Python
train a CNN against a shard of $PS_BIN_DIR."""
import os
import re
import subprocess
import sys

import pytest

WHEEL = os.environ.get("PS_WHEEL", "")
EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                       "pytorch", "train.py")
# What a manylinux wheel may take from the system (python/make_wheel.sh leaves them out).
SYSTEM = re.compile(r"^(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s)\.so\.|^ld-linux")


def is_copy_of(path, soname):
    """Whether `path` (a file /proc/self/maps names: libz.so.1.2.13) is a library of `soname`."""
    name = os.path.basename(path)
    return name == soname or name.startswith(soname + ".")


def clean_env():
    drop = ("PYTHONPATH", "LD_LIBRARY_PATH", "PARAMSERVER_LIBRARY")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(argv, cwd, timeout=300):
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(the venv's python, a working directory outside the source and build trees)"""
    assert os.path.isfile(WHEEL), f"no wheel PS_WHEEL={WHEEL!r}: cmake --build build --target wheel"
    work = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "venv", "--system-site-packages", work / "venv"], work)
    python = work / "venv" / "bin" / "python"
    run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", WHEEL], work)
    return python, work


def test_the_package_and_its_libraries_come_from_the_venv(venv):
    python, work = venv
    # The libraries mapped before `import paramserver` and those it loaded (libparamserver_c.so's).
    out = run([python, "-c", "maps = lambda: {l.split()[-1] for l in open('/proc/self/maps')}\n"
               "before = maps()\nimport paramserver\nprint(paramserver.__file__)\n"
               "print(*before)\nprint(*(maps() - before))"], work).split("\n")
    assert out[0].startswith(str(work / "venv") + "/"), out[0]
    package = os.path.dirname(os.path.realpath(out[0]))  # as /proc/self/maps names it
    lib = os.path.join(package, "libparamserver_c.so")
    bundled = sorted(os.listdir(os.path.join(package, "_libs")))
    assert any(n.startswith("libgrpc++.so") for n in bundled), bundled
    # Each bundled library came from the wheel, but one the interpreter held before (Debian's
    # python3 links libz.so.1): a process holds one library of a soname, the first loaded.
    held = {n for n in bundled if any(is_copy_of(p, n) for p in out[1].split())}
    expected = {os.path.join(package, "_libs", n) for n in bundled if n not in held}
    loaded = set(out[2].split())
    assert expected | {lib} <= loaded, sorted(expected - loaded)
    others = [p for p in loaded - expected if any(is_copy_of(p, n) for n in bundled)]
    assert not others, others
    # ldd of each library alone: everything resolves inside the wheel or to the system's runtime,
    # found through RUNPATH ($ORIGIN), not an environment variable.
    for f in [lib] + [os.path.join(package, "_libs", n) for n in bundled]:
        for name, path in re.findall(r"^\s*(\S+) => (\S+)", run(["ldd", f], work), re.M):
            assert path == os.path.join(package, "_libs", name) or SYSTEM.match(name), \
                f"{f}: {name} => {path}"
        expected = "$ORIGIN/_libs" if f == lib else "$ORIGIN"
        assert f"Library runpath: [{expected}]" in run(["readelf", "-d", f], work), f


def test_two_workers_of_the_venv_train_against_a_shard(venv, start_shards):
    python, work = venv
    spec = work / "cnn.json"
    spec.write_text(run([python, EXAMPLE, "--print_model_spec"], work))
    shards = start_shards(1, str(spec), workers=2, flags=("--optimizer=sgd", "--lr=0.05"))
    workers = [subprocess.Popen([str(python), EXAMPLE, f"--ps={shards.addresses}", f"--rank={r}",
                                 "--num_workers=2", "--steps=300", "--threads=1"],
                                cwd=work, env=clean_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    for rank, (worker, out) in enumerate(zip(workers, outputs)):
        assert worker.returncode == 0, out
        done = re.search(rf"worker {rank}: done at step 300 .*test accuracy ([0-9.]+)", out)
        # Ten classes: an untrained model scores about 0.1.
        assert done and float(done.group(1)) >= 0.6, out
