#include "common/flags_help.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/version.h"

namespace ps {
namespace {

// Where each program's flags are defined (source files without directory and extension), and
// the ones defined there that it does not use.
struct ProgramFlags {
  std::set<std::string> files;
  std::set<std::string> unused;
};

const ProgramFlags& FlagsOf(const std::string& program) {
  static const auto* const kPrograms = new std::map<std::string, ProgramFlags>{
      {"ps", {{"ps_main", "cluster_spec", "metrics"}, {}}},
      {"worker", {{"worker_main", "cluster_spec", "client_flags", "client_start", "metrics"}, {}}},
      {"evaluator",
       {{"evaluator_main", "cluster_spec", "client_flags", "client_start", "metrics"}, {}}},
      {"psctl",
       {{"psctl_main", "cluster_spec", "client_flags"},
        {"role", "health_port", "health_host", "insecure"}}},
      {"export_model",
       {{"export_model_main", "cluster_spec", "client_flags"},
        {"role", "health_port", "health_host", "insecure"}}},
      {"launch", {{"launch_main", "training_run"}, {}}},
      {"experiment", {{"experiment_main", "training_run"}, {}}},
  };
  static const ProgramFlags kNone;
  auto it = kPrograms->find(program);
  return it == kPrograms->end() ? kNone : it->second;
}

// `text` wrapped at `width` columns, each line indented by `indent`.
std::string Wrap(const std::string& text, int indent, int width) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && static_cast<int>(line.size() + 1 + word.size()) > width - indent) {
      absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
  return out;
}

bool IsHelp(const std::string& arg) {
  for (const char* h : {"-h", "--help", "-help", "--helpfull", "-helpfull", "--helpshort",
                        "-helpshort"}) {
    if (arg == h) return true;
  }
  return false;
}

// The source file a flag is defined in, without directory and extension.
std::string SourceOf(const absl::CommandLineFlag& flag) {
  std::string file = flag.Filename();
  file = file.substr(file.rfind('/') + 1);
  return file.substr(0, file.rfind('.'));
}

bool Uses(const ProgramFlags& program, const absl::CommandLineFlag& flag) {
  return program.files.count(SourceOf(flag)) > 0 &&
         program.unused.count(std::string(flag.Name())) == 0;
}

}  // namespace

bool HasFlag(const std::string& program, const std::string& name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && Uses(FlagsOf(program), *flag);
}

std::string FlagsHelp(const std::string& program, const std::string& usage) {
  const ProgramFlags& own = FlagsOf(program);
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (Uses(own, *flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat(usage, "\n\nFlags (--name=value; shown with their defaults):\n");
  for (const absl::CommandLineFlag* f : flags) {
    const std::string value = f->DefaultValue();
    absl::StrAppend(&out, "  --", f->Name(), value.empty() ? "=\"\"" : "=" + value, "\n",
                    Wrap(f->Help(), 6, 100));
  }
  absl::StrAppend(&out, "  --help\n      This text.\n");
  return out;
}

std::vector<char*> ParseFlagsOrHelp(int argc, char** argv, const std::string& program,
                                    const std::string& usage) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (IsHelp(arg)) {
      std::fputs(FlagsHelp(program, usage).c_str(), stdout);
      std::exit(0);
    }
  }
  absl::SetProgramUsageMessage(usage);
  // --version: Abseil prints this and exits 0 once every other flag parsed (psctl spec relies on
  // `DAEMON <flags> --version` checking flags without starting anything).
  absl::FlagsUsageConfig config;
  config.version_string = [] { return VersionLine() + "\n"; };
  absl::SetFlagsUsageConfig(config);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace ps
