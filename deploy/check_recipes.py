#!/usr/bin/python3
"""Offline checks of the deployment recipes in deploy/ (run by tests/deploy_recipes_test.cc).

  check_recipes.py k8s|docker|slurm|systemd --bin=build/bin [--units=DIR]

k8s      deploy/k8s/paramserver.yaml parses; its cluster spec is accepted by the daemons' own
         parser (psctl spec) and agrees with the manifests (shard names and ports, StatefulSet
         replicas, the workers' Indexed Job, GPUs, volumes, scrape annotations, workers' own
         tokens and not the job's).
docker   deploy/docker/Dockerfile: known instructions, a Debian 12 build stage and a CUDA runtime
         stage, and every build dependency deploy/setup.sh installs.
slurm    deploy/slurm/paramserver.sbatch parses (bash -n), and the spec it writes for a made-up
         allocation is accepted by psctl spec with the expected roles.
systemd  deploy/systemd/*.service pass systemd-analyze verify (paths pointed at --bin); with
         --units=DIR the units in DIR as they are (an installed tree's, tests/install).
Prints what it checked; exits 1 naming the first problem, 77 when systemd-analyze is missing.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKER_INSTRUCTIONS = {"FROM", "ARG", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "USER", "CMD",
                       "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "SHELL", "HEALTHCHECK",
                       "STOPSIGNAL", "ONBUILD"}
# What setup.sh installs for tests, tools and plots only: the image needs none of them.
NOT_BUILD_DEPENDENCIES = {"prometheus", "curl", "gnuplot-nox", "python3", "python3-numpy",
                          "python3-yaml", "iperf3", "iproute2", "openssl", "iptables",
                          "libnetfilter-queue-dev", "systemd", "clang", "dpkg-dev",
                          "debootstrap"}


class Problem(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Problem(message)


def roles(bin_dir, spec_text):
    """The roles psctl spec lists for a spec (the daemons' own parser), each then parsed by its
    daemon (`--version` exits once the flags parsed: an unknown or bad flag fails), or a
    Problem."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(spec_text)
    try:
        out = subprocess.run([os.path.join(bin_dir, "psctl"), "spec", "--cluster=" + f.name],
                             capture_output=True, text=True, timeout=60)
        check(out.returncode == 0, "psctl spec refused the spec: " + out.stderr.strip())
        listed = {line.split(" ", 1)[0]: line for line in out.stdout.splitlines()}
        for role in listed:
            program = role.split(":")[0]
            daemon = subprocess.run([os.path.join(bin_dir, program), "--cluster=" + f.name,
                                     "--role=" + role, "--version"],
                                    capture_output=True, text=True, timeout=60)
            check(daemon.returncode == 0,
                  f"{program} refused what the spec makes {role}: {daemon.stderr.strip()}")
    finally:
        os.unlink(f.name)
    return listed


def check_k8s(bin_dir):
    import yaml  # python3-yaml: CMake checks that the tests' interpreter has it
    path = os.path.join(ROOT, "deploy/k8s/paramserver.yaml")
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    by_kind = {}
    for d in docs:
        for field in ("apiVersion", "kind", "metadata"):
            check(field in d, f"a document without {field}")
        check(d["metadata"].get("name"), f"a {d['kind']} without a name")
        by_kind.setdefault(d["kind"], []).append(d)
    config = by_kind["ConfigMap"][0]
    spec_text = config["data"]["cluster.json"]
    spec = json.loads(spec_text)
    listed = roles(bin_dir, spec_text)
    service = by_kind["Service"][0]
    sts = by_kind["StatefulSet"][0]
    check(service["spec"].get("clusterIP") == "None", "the shards' Service is not headless")
    check(service["spec"].get("publishNotReadyAddresses") is True,
          "shard names must resolve before the shards are ready (they listen on them)")
    check(sts["spec"]["serviceName"] == service["metadata"]["name"],
          "the StatefulSet's serviceName is not the headless Service")
    check(sts["spec"]["replicas"] == len(spec["shards"]),
          f"{sts['spec']['replicas']} shard pods for {len(spec['shards'])} shards in the spec")
    ps_container = sts["spec"]["template"]["spec"]["containers"][0]
    grpc_port = {p["name"]: p["containerPort"] for p in ps_container["ports"]}["grpc"]
    for i, shard in enumerate(spec["shards"]):
        want = f"{sts['metadata']['name']}-{i}.{service['metadata']['name']}:{grpc_port}"
        check(shard == want, f"shard {i} is {shard} in the spec; its pod is reached as {want}")
        check(f"ps:{i}" in listed, f"psctl spec lists no ps:{i}")
    check("--role=ps:${POD_INDEX}" in " ".join(ps_container["command"]),
          "the shard pods do not take their role from their ordinal")
    index = {e["name"]: e for e in ps_container.get("env", [])}.get("POD_INDEX", {})
    check(index.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") ==
          "metadata.labels['apps.kubernetes.io/pod-index']", "POD_INDEX is not the pod's ordinal")
    # What a shard checks when it starts (it refuses to listen beyond loopback unguarded).
    security = spec.get("security", {})
    check("token_file" in security or {"ca", "server_cert", "server_key"} <= set(security),
          "shards listening beyond loopback need a token or TLS in the spec")
    for role in ("ps", "worker"):
        flags = spec.get(role, {})
        if flags.get("metrics_host", "127.0.0.1") not in ("127.0.0.1", "localhost"):
            check(flags.get("metrics_insecure") is True,
                  f"{role}: metrics beyond loopback need metrics_insecure")
    jobs = {j["metadata"]["name"]: j for j in by_kind["Job"]}
    workers = next(j for j in jobs.values() if j["spec"].get("completionMode") == "Indexed")
    check(workers["spec"]["completions"] == spec["workers"] == workers["spec"]["parallelism"],
          "the workers' Job does not run one pod per worker of the spec")
    worker_container = workers["spec"]["template"]["spec"]["containers"][0]
    check("--role=worker:${JOB_COMPLETION_INDEX}" in " ".join(worker_container["command"]),
          "the worker pods do not take their rank from the Job's index")
    check(worker_container["resources"]["limits"].get("nvidia.com/gpu") == 1,
          "the workers request no GPU")
    check(len([r for r in listed if r.startswith("worker:")]) == spec["workers"],
          "psctl spec lists another number of workers")
    # Each worker holds a token of its own (per-worker identity), and no worker pod the job's.
    worker_tokens = security.get("worker_token_file", "")
    check("{rank}" in worker_tokens,
          "the workers would hold the job's token: give each its own (security.worker_token_file)")

    def secret_at(pod, container, path):
        """The Secret mounted at `path`'s directory in `container`, or None."""
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        volume = mounts.get(os.path.dirname(path))
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        return volumes.get(volume, {}).get("secret", {}).get("secretName")

    worker_pod = workers["spec"]["template"]["spec"]
    check(secret_at(worker_pod, worker_container, worker_tokens) is not None,
          "the worker pods do not mount the Secret of their own tokens")
    job_secret = secret_at(sts["spec"]["template"]["spec"], ps_container, security["token_file"])
    worker_secrets = {v["secret"]["secretName"] for v in worker_pod.get("volumes", [])
                      if "secret" in v}
    check(job_secret not in worker_secrets, "the worker pods mount the job's token")
    # Every pod: its mounts exist, the ConfigMap it mounts is this one, scrape annotations name
    # the port the spec gives the daemon's metrics.
    for d in docs:
        pod = d.get("spec", {}).get("template", {}).get("spec")
        if pod is None:
            continue
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in d["spec"].get("volumeClaimTemplates", [])}
        for c in pod["containers"]:
            check(c["image"].startswith("paramserver"), f"{d['metadata']['name']}: another image")
            for m in c.get("volumeMounts", []):
                check(m["name"] in volumes or m["name"] in claims,
                      f"{d['metadata']['name']}: mount {m['name']} has no volume")
        for v in volumes.values():
            if "configMap" in v:
                check(v["configMap"]["name"] == config["metadata"]["name"],
                      f"{d['metadata']['name']} mounts another ConfigMap")
        annotations = d["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            program = " ".join(pod["containers"][0]["command"])
            role = next(r for r in ("ps", "worker", "evaluator") if f"exec {r} " in program or
                        program.startswith(r + " "))
            check(str(spec[role]["metrics_port"]) == annotations["prometheus.io/port"],
                  f"{d['metadata']['name']}: scraped on another port than its metrics")
    print(f"k8s: {len(docs)} documents ({', '.join(sorted(by_kind))}); spec accepted: "
          f"{len(listed)} roles")
    return 0


def check_docker(_):
    path = os.path.join(ROOT, "deploy/docker/Dockerfile")
    with open(path) as f:
        text = f.read()
    lines = re.sub(r"\\\n", " ", text).splitlines()  # continuation lines joined
    stages = []
    installed = set()
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word = line.split()[0].upper()
        check(word in DOCKER_INSTRUCTIONS, f"Dockerfile: unknown instruction {word}")
        if word == "FROM":
            stages.append(line)
        if word == "RUN" and "apt-get install" in line:
            installed.update(w for w in line.split() if re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", w))
    check(len(stages) >= 2, "Dockerfile: not a multi-stage build")
    check(re.match(r"FROM debian:12 AS build", stages[0]), "Dockerfile: build on Debian 12 first")
    check("CUDA_RUNTIME" in stages[-1] and "nvidia/cuda" in text,
          "Dockerfile: the image must run on a CUDA runtime base")
    check("COPY --from=build" in text, "Dockerfile: nothing is taken from the build stage")
    with open(os.path.join(ROOT, "deploy/setup.sh")) as f:
        setup = f.read()
    packages = re.sub(r"#.*", "", re.search(r"packages=\((.*?)\)", setup, re.S).group(1)).split()
    missing = [p for p in packages if p not in installed and p not in NOT_BUILD_DEPENDENCIES]
    check(not missing, "Dockerfile: setup.sh's build dependencies missing: " + " ".join(missing))
    print(f"docker: {len(stages)} stages; installs every build dependency of setup.sh")
    return 0


def check_slurm(bin_dir):
    script = os.path.join(ROOT, "deploy/slurm/paramserver.sbatch")
    check(subprocess.run(["bash", "-n", script]).returncode == 0, "sbatch script: bash -n fails")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PS_", "SLURM_"))}
    env.update(SLURM_JOB_NODELIST="cpu1,cpu2,gpu1,gpu2,gpu3", PS_GPUS_PER_NODE="2",
               PS_RUN_DIR="/shared/run")
    out = subprocess.run([script, "--print-spec"], env=env, capture_output=True, text=True,
                         timeout=60, cwd=tempfile.gettempdir())
    check(out.returncode == 0, "sbatch script --print-spec failed: " + out.stderr)
    spec = json.loads(out.stdout)
    check(spec["shards"] == ["cpu1:50051", "cpu2:50051"], f"shards {spec['shards']}")
    check(spec["workers"] == 6, f"{spec['workers']} workers for 3 GPU nodes x 2 GPUs")
    check("{rank}" in spec.get("security", {}).get("worker_token_file", ""),
          "the workers would hold the job's token: give each its own (worker_token_file)")
    listed = roles(bin_dir, out.stdout)
    check("worker:5" in listed and "ps:1" in listed and "evaluator" in listed,
          "psctl spec lists other roles: " + ", ".join(listed))
    # Too small an allocation is refused with a reason.
    env["SLURM_JOB_NODELIST"] = "cpu1,cpu2"
    out = subprocess.run([script, "--print-spec"], env=env, capture_output=True, text=True,
                         timeout=60, cwd=tempfile.gettempdir())
    check(out.returncode != 0 and "no node left for workers" in out.stderr,
          "an allocation with no worker node was not refused")
    print(f"slurm: spec for 5 nodes accepted ({len(listed)} roles); 2 nodes refused")
    return 0


def check_systemd(bin_dir, units_dir=None):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("skipped: systemd-analyze is not installed")
        return 77
    source = units_dir or os.path.join(ROOT, "deploy/systemd")
    units = sorted(f for f in os.listdir(source))
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for unit in units:
            with open(os.path.join(source, unit)) as f:
                text = f.read()
            if units_dir is None:
                text = text.replace("/opt/paramserver/bin", os.path.abspath(bin_dir))
            name = unit.replace("@.", "@0.")  # a template is verified as an instance
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
            paths.append(os.path.join(tmp, name))
        out = subprocess.run([analyze, "verify", "--recursive-errors=no", *paths],
                             capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, SYSTEMD_LOG_LEVEL="notice"))
        problems = [l for l in (out.stdout + out.stderr).splitlines() if l.strip()]
        check(out.returncode == 0 and not problems, "systemd-analyze verify: " + "; ".join(problems))
    print(f"systemd: {', '.join(units)} verified")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["k8s", "docker", "slurm", "systemd"])
    parser.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    parser.add_argument("--units", help="systemd: verify the units in this directory as they are")
    args = parser.parse_args()
    checks = {"k8s": check_k8s, "docker": check_docker, "slurm": check_slurm,
              "systemd": lambda bin_dir: check_systemd(bin_dir, args.units)}
    try:
        return checks[args.what](args.bin)
    except Problem as p:
        print(f"check_recipes {args.what}: {p}", file=sys.stderr)
        return 1
    except (KeyError, StopIteration, IndexError, ValueError) as e:
        print(f"check_recipes {args.what}: a recipe lacks what the check expects "
              f"({type(e).__name__}: {e})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
