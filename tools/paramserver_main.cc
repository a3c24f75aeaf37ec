// paramserver: the one installed command. `paramserver VERB [args]` runs the program VERB with the
// user's arguments (git-style), so that no generic name (ps, worker, launch) lands on PATH. The
// programs live in <prefix>/libexec/paramserver (installed) or beside this command (the build
// tree's build/bin). psctl's commands are verbs too: `paramserver status ...` = `psctl status ...`.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/version.h"
#include "deploy/subprocess.h"

namespace {

struct Verb {
  const char* name;
  const char* program;  // the program it runs
  const char* command;  // the program's first argument, or nullptr
  const char* summary;
};

// The one table of verbs: --help lists it, dispatch reads it.
constexpr Verb kVerbs[] = {
    {"ps", "ps", nullptr, "a parameter-server shard"},
    {"worker", "worker", nullptr, "a training worker"},
    {"evaluator", "evaluator", nullptr, "scores the shards' model on the test set as it trains"},
    {"launch", "launch", nullptr, "a whole job on this machine: shards, workers, evaluator"},
    {"experiment", "experiment", nullptr,
     "runs a matrix of training configurations and writes a report"},
    {"export_model", "export_model", nullptr, "writes a job's model as one safetensors file"},
    {"psctl", "psctl", nullptr, "a running job at a glance and at hand (the verbs below)"},
    {"status", "psctl", "status", "= psctl status: the shards' state, one line each"},
    {"checkpoint", "psctl", "checkpoint", "= psctl checkpoint: every shard writes one now"},
    {"export", "psctl", "export", "= psctl export: the running job's model as one file"},
    {"spec", "psctl", "spec", "= psctl spec: each role's flags, from a cluster spec"},
    {"worker-token", "psctl", "worker-token", "= psctl worker-token: a worker's own token"},
};

const Verb* FindVerb(const std::string& name) {
  for (const Verb& verb : kVerbs) {
    if (name == verb.name) return &verb;
  }
  return nullptr;
}

std::string VerbNames() {
  std::string names;
  for (const Verb& verb : kVerbs) names += std::string(names.empty() ? "" : ", ") + verb.name;
  return names;
}

int PrintHelp() {
  std::printf("Usage: paramserver VERB [flags]   (paramserver help VERB: the verb's flags)\n\n");
  for (const Verb& verb : kVerbs) std::printf("  %-13s %s\n", verb.name, verb.summary);
  std::printf("\n  --version     prints the version\n");
  return 0;
}

// Installed, the programs are in <prefix>/libexec/paramserver (PS_LIBEXEC_FROM_BIN, relative to
// bin/); in the build tree, beside this command. Never bin/ itself when installed: /usr/bin/ps is
// procps's.
std::string ProgramDir() {
  const std::string own = ps::ExecutableDir();
  const std::string libexec = own + "/" PS_LIBEXEC_FROM_BIN;
  struct stat info;
  return stat(libexec.c_str(), &info) == 0 && S_ISDIR(info.st_mode) ? libexec : own;
}

// Replaces this process with `verb`'s program; returns only on failure.
int Run(const Verb& verb, int argc, char** argv) {
  const std::string path = ProgramDir() + "/" + verb.program;
  std::string program = verb.program;
  std::vector<char*> args = {program.data()};
  if (verb.command != nullptr) args.push_back(const_cast<char*>(verb.command));
  args.insert(args.end(), argv, argv + argc);
  args.push_back(nullptr);
  execv(path.c_str(), args.data());
  std::fprintf(stderr, "paramserver: cannot run %s (%s): %s\n", verb.name, path.c_str(),
               std::strerror(errno));
  return 127;
}

int UnknownVerb(const std::string& name) {
  std::fprintf(stderr, "paramserver: unknown verb '%s'; the verbs: %s (see paramserver --help)\n",
               name.c_str(), VerbNames().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintHelp();
    return 2;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h" || (first == "help" && argc == 2)) return PrintHelp();
  if (first == "--version") {
    std::printf("%s\n", ps::VersionLine().c_str());
    return 0;
  }
  if (first == "help") {
    const Verb* verb = FindVerb(argv[2]);
    if (verb == nullptr) return UnknownVerb(argv[2]);
    char help[] = "--help";
    char* args[] = {help};
    return Run(*verb, 1, args);
  }
  const Verb* verb = FindVerb(first);
  if (verb == nullptr) return UnknownVerb(first);
  return Run(*verb, argc - 2, argv + 2);
}
