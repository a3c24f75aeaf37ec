#!/usr/bin/python3
"""Keeps README.md's commands true: every `build/bin/PROGRAM ...` in its code blocks names a
program that is built, a psctl command that exists, and only flags that PROGRAM --help lists;
every `deploy/...` script it runs exists. (Running them all needs hosts, GPUs and minutes; their
flags are what drifts.)

  check_readme.py README.md build/bin

Prints what it checked; exits 1 naming each problem.
"""
import os
import re
import shlex
import subprocess
import sys

BUILTIN = {"help", "version", "flagfile", "fromenv", "tryfromenv", "undefok"}  # Abseil's own
PSCTL_COMMANDS = {"status", "checkpoint", "export", "spec", "worker-token"}
PROGRAMS = {"ps", "worker", "evaluator", "psctl", "export_model", "launch", "experiment"}
MIN_FLAGS = 60  # README has ~80 today: fewer means the checker stopped finding them


def code_blocks(text):
    """(first line number, text) of each fenced block that is shell or untagged."""
    blocks = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) in ("", "bash", "sh"):
            blocks.append((text[:m.start()].count("\n") + 2, m.group(2)))
    return blocks


def commands(block):
    """Each command of a block, continuation lines joined and $variables set in it expanded."""
    joined = re.sub(r"\\\n\s*", " ", block)
    variables = {}
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if not line:
            continue
        assignment = re.fullmatch(r'(\w+)=(?:"([^"]*)"|(\S*))', line)
        if assignment:
            variables[assignment.group(1)] = assignment.group(2) or assignment.group(3) or ""
            continue
        line = re.sub(r"\$(\w+)|\$\{(\w+)\}",
                      lambda v: variables.get(v.group(1) or v.group(2), v.group(0)), line)
        out.extend(part.strip() for part in re.split(r"&&|\|\||;|\|", line))
    return out


def main():
    readme, bin_dir = sys.argv[1], sys.argv[2]
    root = os.path.dirname(os.path.abspath(readme))
    with open(readme) as f:
        text = f.read()
    helps, problems, checked = {}, [], 0
    for first_line, block in code_blocks(text):
        for command in commands(block):
            try:
                words = shlex.split(command)
            except ValueError:
                continue
            # Leading VAR=value words (PS_ROLE=ps:0 build/bin/ps ...) and sudo are not the program.
            start = 0
            while start < len(words) and (re.fullmatch(r"\w+=\S*", words[start]) or
                                          words[start] == "sudo"):
                start += 1
            for i, word in enumerate(words):
                if word.startswith("deploy/") and not os.path.exists(os.path.join(root, word)):
                    problems.append(f"README.md:{first_line}: {word} does not exist")
                # A program run by its path, or by its bare name as a command's first word.
                if word.startswith("build/bin/"):
                    program = word[len("build/bin/"):]
                elif i == start and word in PROGRAMS:
                    program = word
                else:
                    continue
                path = os.path.join(bin_dir, program)
                if not os.access(path, os.X_OK):
                    problems.append(f"README.md:{first_line}: no program {word}")
                    break
                if program not in helps:
                    out = subprocess.run([path, "--help"], capture_output=True, text=True,
                                         timeout=60)
                    helps[program] = set(re.findall(r"^  --(\w+)", out.stdout, re.M))
                    if out.returncode != 0:
                        problems.append(f"{program} --help exited {out.returncode}")
                args = words[i + 1:]
                if program == "psctl" and args and not args[0].startswith("-"):
                    if args[0] not in PSCTL_COMMANDS:
                        problems.append(f"README.md:{first_line}: psctl has no command {args[0]}")
                for arg in args:
                    flag = re.match(r"--?(\w+)", arg)
                    if not flag or arg.startswith("---"):
                        continue
                    name = flag.group(1)
                    checked += 1
                    if name not in helps[program] and name not in BUILTIN:
                        problems.append(f"README.md:{first_line}: {program} has no flag --{name} "
                                        f"(in: {command[:100]})")
                break
    if checked < MIN_FLAGS:
        problems.append(f"only {checked} flags found in README's commands (expected >= "
                        f"{MIN_FLAGS}): is the checker still reading them?")
    for p in problems:
        print(p, file=sys.stderr)
    print(f"README.md: {checked} flags of {len(helps)} programs checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
