"""Clang's thread-safety analysis over every project C++ source the build compiles, so that
ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED and the rest are checked, not decoration (GCC
ignores them).

  check_thread_safety.py CLANG_CXX BUILD_DIR/compile_commands.json SOURCE_DIR [JOBS]

Re-runs each .cc file's own compile command from compile_commands.json (not generated code, not
.cu) as `CLANG_CXX -fsyntax-only -Wthread-safety -Werror=thread-safety`, JOBS at a time (default:
the CPU count). Only files that can give a diagnostic are checked: those that use a lock
themselves (Mutex, CondVar, ...Lock) or include, directly or not, a project header that does or
has a thread-safety annotation; in any other file the analysis has nothing to check (that skips about
two thirds of the files, and of the time: 240 s on 2 cores before). Prints every diagnostic, then one summary line; exits 1 on any thread-safety
error, on a file clang cannot parse, or when clang++ is missing. The ThreadSafetyAnalysis test
(tests/CMakeLists.txt) runs it after the build, which generates the protobuf headers it needs.
"""
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import time

FOLDERS = ("common", "transport", "kernels", "server", "client", "trainer", "deploy", "tools", "tests", "bench")
# GCC options clang rejects (unknown -W options are only warned about, and silenced below).
GCC_ONLY = ("-fconcepts", "-fext-numeric-literals", "-fmax-errors=", "-fipa-", "-fno-ipa-",
            "-ftree-", "-fno-tree-", "-fvar-tracking", "-fno-var-tracking",
            "-fno-semantic-interposition", "-flto=", "-ffat-lto-objects", "-fno-fat-lto-objects")
FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
         "-Wno-unknown-warning-option", "-Wno-unused-command-line-argument"]
# A file's own use of a lock, and a header's thread-safety annotation (Abseil's names).
USES_LOCKS = re.compile(r"Mutex|CondVar|Lock\b|ABSL_[A-Z_]*(?:LOCK|GUARDED|THREAD_SAFETY)")
ANNOTATION = re.compile(r"ABSL_(?:PT_)?GUARDED_BY|ABSL_[A-Z_]*(?:LOCKS?_|LOCKABLE|LOCK_FUNCTION|"
                        r"ACQUIRED_|CAPABILITY|NO_THREAD_SAFETY)")
PROJECT_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def may_use_locks(path, source, headers):
    """Whether clang's analysis can find anything in `path`: it uses a lock, or one of the project
    headers it includes (transitively; `headers` caches what each holds) uses one or is
    annotated."""
    with open(path, errors="replace") as f:
        text = f.read()
    if USES_LOCKS.search(text):
        return True
    seen, todo = set(), [m.group(1) for m in PROJECT_INCLUDE.finditer(text)]
    while todo:
        header = os.path.join(source, todo.pop())
        if header in seen or not os.path.isfile(header):
            continue  # generated (build/) and system headers: not the project's annotations
        seen.add(header)
        if header not in headers:
            with open(header, errors="replace") as f:
                body = f.read()
            headers[header] = (bool(ANNOTATION.search(body) or USES_LOCKS.search(body)),
                               [m.group(1) for m in PROJECT_INCLUDE.finditer(body)])
        annotated, includes = headers[header]
        if annotated:
            return True
        todo.extend(includes)
    return False


def clang_command(clang, command):
    """The build's command line with clang in place of the compiler, checking instead of
    compiling."""
    args = shlex.split(command)
    skip = 2 if os.path.basename(args[0]) in ("ccache", "sccache") else 1
    out, i = [clang], skip
    while i < len(args):
        if args[i] == "-o":
            i += 1  # and its argument
        elif args[i] != "-c" and not args[i].startswith(GCC_ONLY):
            out.append(args[i])
        i += 1
    return out + FLAGS


def main(clang, database, source, jobs):
    if not os.access(clang, os.X_OK):
        sys.exit(f"check_thread_safety: clang++ not found ('{clang}'): install Debian's clang "
                 "(deploy/setup.sh does) and reconfigure the build")
    try:
        with open(database) as f:
            entries = json.load(f)
    except OSError as e:
        sys.exit(f"check_thread_safety: cannot read {database} ({e.strerror}): configure the "
                 "build with CMAKE_EXPORT_COMPILE_COMMANDS=ON (the top CMakeLists.txt sets it)")
    roots = tuple(os.path.join(source, f) + os.sep for f in FOLDERS)
    sources = [e for e in entries if e["file"].endswith(".cc") and e["file"].startswith(roots)]
    if not sources:
        sys.exit(f"check_thread_safety: no sources under {source}/{{{','.join(FOLDERS)}}} "
                 f"in {database}")
    headers = {}
    files = [e for e in sources if may_use_locks(e["file"], source, headers)]

    def check(entry):
        return subprocess.run(clang_command(clang, entry["command"]), cwd=entry["directory"],
                              capture_output=True, text=True)

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(check, files))
    errors, bad_files, broken = 0, 0, []
    for entry, result in zip(files, results):
        name = os.path.relpath(entry["file"], source)
        if result.stderr:
            print(f"=== {name}\n{result.stderr}", end="")
        found = sum("[-Werror,-Wthread-safety" in line for line in result.stderr.splitlines())
        errors += found
        bad_files += found > 0
        if result.returncode != 0 and not found:
            broken.append(name)
    version = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout
    summary = (f"ThreadSafetyAnalysis: {len(files)} files of {len(sources)} (the others use no "
               f"lock and include no header that does), {version.splitlines()[0]}, {jobs} "
               f"jobs, {time.monotonic() - start:.0f} s:")
    if errors == 0 and not broken:
        print(summary, "no thread-safety errors")
        return 0
    if errors:
        summary += f" {errors} thread-safety errors in {bad_files} files (above);"
    if broken:
        summary += (f" {len(broken)} files clang could not compile (errors above; run it after "
                    f"the build, which generates the protobuf headers): {' '.join(broken)}")
    print(summary.rstrip(";"))
    return 1


if __name__ == "__main__":
    if not 4 <= len(sys.argv) <= 5:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3].rstrip("/"),
                  int(sys.argv[4]) if len(sys.argv) == 5 else os.cpu_count()))
