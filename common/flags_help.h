// The programs' command lines. `--help` (also -h, -help, --helpfull, --helpshort) prints the
// program's usage and the flags that apply to it, sorted, each with its default and without build
// paths, and exits 0; Abseil's own help lists every flag linked into the binary under the path
// it was compiled from, and exits 1. `--version` prints VersionLine() (common/version.h) and
// exits 0 once the other flags parsed. Anything else is parsed as absl::ParseCommandLine does.
#pragma once

#include <string>
#include <vector>

namespace ps {

// `program`: "ps", "worker", "evaluator", "psctl", "export_model", "launch" or "experiment".
// Returns the positional arguments (argv[0] first), as absl::ParseCommandLine.
std::vector<char*> ParseFlagsOrHelp(int argc, char** argv, const std::string& program,
                                    const std::string& usage);

// Whether `program` has a flag `name` of its own (one its --help lists).
bool HasFlag(const std::string& program, const std::string& name);

// The help text ParseFlagsOrHelp prints for `program`.
std::string FlagsHelp(const std::string& program, const std::string& usage);

}  // namespace ps
