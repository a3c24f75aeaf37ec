#!/usr/bin/python3
"""Keeps README.md and the manual in docs/ true: in every fenced shell block, every
`build/bin/PROGRAM ...` and every `paramserver VERB ...` (the installed front command; VERB is a
program or one of psctl's commands) names a program that is built, a psctl command that exists,
and only flags that PROGRAM --help lists; every `deploy/`, `tools/`, `bench/` or `examples/` file
a command names exists; every relative link (a page, a file, a #heading) resolves; README stays a
landing page of at most MAX_README_LINES lines. (Running the commands needs hosts, GPUs and
minutes; their flags are what drifts.)

  check_readme.py README.md build/bin       (checks README.md and every docs/**/*.md beside it)

Prints what it checked; exits 1 naming each problem.
"""
import glob
import os
import re
import shlex
import subprocess
import sys

BUILTIN = {"help", "version", "flagfile", "fromenv", "tryfromenv", "undefok"}  # Abseil's own
PSCTL_COMMANDS = {"status", "checkpoint", "export", "spec", "worker-token"}
PROGRAMS = {"ps", "worker", "evaluator", "psctl", "export_model", "launch", "experiment"}
FRONT = {"paramserver", "build/bin/paramserver"}  # `paramserver VERB` runs the program VERB
REPO_PATHS = ("deploy/", "tools/", "bench/", "examples/")
MIN_FLAGS = 150  # README and docs/ have 182 today: fewer means the checker stopped finding them
MAX_README_LINES = 300


def code_blocks(text):
    """(first line number, text) of each fenced block that is shell or untagged."""
    blocks = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) in ("", "bash", "sh"):
            blocks.append((text[:m.start()].count("\n") + 2, m.group(2)))
    return blocks


def prose(text):
    """`text` with every fenced block blanked (line numbers kept)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text,
                  flags=re.S | re.M)


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


def program_and_args(words, i, start):
    """(program, its arguments) when words[i] runs one, else None; ("", why) for a bad verb."""
    word = words[i]
    if word in FRONT and (i == start or word != "paramserver"):
        rest = words[i + 1:]
        if not rest or rest[0] in ("--version", "--help"):
            return None
        verb = rest[1] if rest[0] == "help" and len(rest) > 1 else rest[0]
        if verb in PSCTL_COMMANDS:
            return "psctl", [verb] + rest[1:]
        if verb in PROGRAMS:
            return verb, ([] if rest[0] == "help" else rest[1:])
        return "", f"paramserver has no verb {verb}"
    if word.startswith("build/bin/"):
        return word[len("build/bin/"):], words[i + 1:]
    if i == start and word in PROGRAMS:
        return word, words[i + 1:]
    return None


class Checker:
    def __init__(self, root, bin_dir):
        self.root, self.bin_dir = root, bin_dir
        self.helps, self.problems, self.checked = {}, [], 0

    def flags_of(self, program):
        if program not in self.helps:
            out = subprocess.run([os.path.join(self.bin_dir, program), "--help"],
                                 capture_output=True, text=True, timeout=60)
            self.helps[program] = set(re.findall(r"^  --(\w+)", out.stdout, re.M))
            if out.returncode != 0:
                self.problems.append(f"{program} --help exited {out.returncode}")
        return self.helps[program]

    def check_command(self, where, command):
        try:
            words = shlex.split(command)
        except ValueError:
            return
        # Leading VAR=value words (PS_ROLE=ps:0 build/bin/ps ...) and sudo are not the program.
        start = 0
        while start < len(words) and (re.fullmatch(r"\w+=\S*", words[start]) or
                                      words[start] == "sudo"):
            start += 1
        for i, word in enumerate(words):
            if word.startswith(REPO_PATHS) and not os.path.exists(os.path.join(self.root, word)):
                self.problems.append(f"{where}: {word} does not exist")
            found = program_and_args(words, i, start)
            if found is None:
                continue
            program, args = found
            if not program:
                self.problems.append(f"{where}: {args}")
            elif not os.access(os.path.join(self.bin_dir, program), os.X_OK):
                self.problems.append(f"{where}: no program {word} ({program})")
            else:
                self.check_args(where, command, program, args)
            return

    def check_args(self, where, command, program, args):
        flags = self.flags_of(program)
        if program == "psctl" and args and not args[0].startswith("-"):
            if args[0] not in PSCTL_COMMANDS:
                self.problems.append(f"{where}: psctl has no command {args[0]}")
        for arg in args:
            flag = re.match(r"--?(\w+)", arg)
            if not flag or arg.startswith("---"):
                continue
            self.checked += 1
            if flag.group(1) not in flags and flag.group(1) not in BUILTIN:
                self.problems.append(f"{where}: {program} has no flag --{flag.group(1)} "
                                     f"(in: {command[:100]})")

    def check_links(self, path, name, text):
        """Every relative [text](target) outside code resolves: the file, and its #heading."""
        outside_code = prose(text)
        for m in re.finditer(r"\]\(([^)\s]+)\)", outside_code):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            where = f"{name}:{outside_code[:m.start()].count(chr(10)) + 1}"
            file_part, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part) if file_part
                                      else path)
            if file_part and not os.path.exists(linked):
                self.problems.append(f"{where}: link to {target}: no file {file_part}")
            elif anchor and linked.endswith(".md") and anchor not in anchors(linked):
                self.problems.append(f"{where}: link to {target}: no heading #{anchor}")

    def check_file(self, path):
        name = os.path.relpath(path, self.root)
        with open(path) as f:
            text = f.read()
        for first_line, block in code_blocks(text):
            for command in commands(block):
                self.check_command(f"{name}:{first_line}", command)
        self.check_links(path, name, text)


def anchors(path):
    """GitHub's anchors of the headings of the Markdown file at `path`."""
    with open(path) as f:
        headings = re.findall(r"^#+\s+(.*?)\s*$", prose(f.read()), re.M)
    seen, out = {}, set()
    for heading in headings:
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def main():
    readme, bin_dir = sys.argv[1], sys.argv[2]
    root = os.path.dirname(os.path.abspath(readme))
    files = [readme] + sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    checker = Checker(root, bin_dir)
    for path in files:
        checker.check_file(path)
    with open(readme) as f:
        readme_lines = f.read().count("\n")
    if readme_lines > MAX_README_LINES:
        checker.problems.append(f"README.md has {readme_lines} lines (at most "
                                f"{MAX_README_LINES}): move the topic to a page in docs/")
    if checker.checked < MIN_FLAGS:
        checker.problems.append(f"only {checker.checked} flags found in the commands (expected "
                                f">= {MIN_FLAGS}): is the checker still reading them?")
    for p in checker.problems:
        print(p, file=sys.stderr)
    print(f"{len(files)} files: {checker.checked} flags of {len(checker.helps)} programs checked, "
          f"{len(checker.problems)} problems")
    return 1 if checker.problems else 0


if __name__ == "__main__":
    sys.exit(main())
