// export_model: writes a job's model as one safetensors file under the model's own tensor names
// (worker/model_file.h), from the shards' checkpoints or from the live shards.
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/cluster.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "tools/model_export.h"
#include "worker/client_flags.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "Export the newest readable checkpoint of every shard in this directory (ps "
          "--checkpoint_dir).");
ABSL_FLAG(std::string, ps, "",
          "Or export from the live shards: host:port,host:port,... in shard order.");
ABSL_FLAG(std::string, hidden, "256,128", "Hidden layer sizes of the MLP (as the workers').");
ABSL_FLAG(std::string, out, "", "The model file to write (safetensors).");
ABSL_FLAG(double, retry_seconds, 60, "--ps: give up after a shard has been unreachable this long.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("export_model", reason); }

absl::StatusOr<ModelFile> FromShards(const std::string& model) {
  absl::StatusOr<std::vector<std::string>> addresses = ParseShardAddresses(absl::GetFlag(FLAGS_ps));
  if (!addresses.ok()) return addresses.status();
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromFlags();
  if (!security.ok()) return security.status();
  ClientOptions options;
  options.retry_for = absl::Seconds(absl::GetFlag(FLAGS_retry_seconds));
  options.security = *std::move(security);
  return ModelFromShards(*addresses, model, options);
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a job's model as one safetensors file (fc1.weight [784,256], fc1.bias [256], ...).\n"
      "Examples: export_model --checkpoint_dir=ckpt --out=model.safetensors\n"
      "          export_model --ps=host1:50051,host2:50051 --token_file=read-token "
      "--out=model.safetensors");
  absl::ParseCommandLine(argc, argv);
  SetLogTag("export_model");
  const std::string dir = absl::GetFlag(FLAGS_checkpoint_dir), out = absl::GetFlag(FLAGS_out);
  if (dir.empty() == absl::GetFlag(FLAGS_ps).empty()) {
    return Fail("give either --checkpoint_dir or --ps");
  }
  if (out.empty()) return Fail("--out is required");
  absl::StatusOr<std::vector<int>> sizes = MlpLayerSizes(784, absl::GetFlag(FLAGS_hidden), 10);
  if (!sizes.ok()) return Fail(std::string(sizes.status().message()));
  const absl::Time start = absl::Now();
  absl::StatusOr<ModelFile> file =
      dir.empty() ? FromShards(MlpSpec(*sizes)) : ModelFromCheckpoints(dir, MlpSpec(*sizes));
  if (!file.ok()) return Fail(std::string(file.status().message()));
  if (absl::Status s = WriteModelFile(out, *file); !s.ok()) return Fail(std::string(s.message()));
  std::printf("%s\n",
              absl::StrFormat("wrote %s (%d parameters, versions [%s]) to %s in %.3f s",
                              file->model, file->params.size(), absl::StrJoin(file->versions, ","),
                              out, absl::ToDoubleSeconds(absl::Now() - start))
                  .c_str());
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
