// export_model: writes a job's model as one safetensors file under the model's own tensor names
// (trainer/model_file.h), from the shards' checkpoints or from the live shards.
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "common/cluster.h"
#include "common/cluster_spec.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "tools/model_export.h"
#include "client/client_flags.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "Export the newest readable checkpoint of every shard in this directory (ps "
          "--checkpoint_dir).");
ABSL_FLAG(std::string, out, "", "The model file to write (safetensors).");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("export_model", reason); }

int Main(int argc, char** argv) {
  absl::StatusOr<ParsedCommandLine> parsed = ParseDaemonFlags(
      argc, argv, "export_model",
      "Writes a job's model as one safetensors file (fc1.weight [784,256], fc1.bias [256], ...).\n"
      "Examples: export_model --checkpoint_dir=ckpt --out=model.safetensors\n"
      "          export_model --ps=host1:50051,host2:50051 --token_file=read-token "
      "--out=model.safetensors");
  if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
  if (!parsed->positional.empty()) {
    return Fail("unexpected argument '" + parsed->positional[0] + "' (flags are --name=value)");
  }
  SetLogTag("export_model");
  if (!parsed->spec_summary.empty()) {
    PS_LOG(INFO) << "from the cluster spec: " << parsed->spec_summary;
  }
  const std::string dir = absl::GetFlag(FLAGS_checkpoint_dir), out = absl::GetFlag(FLAGS_out);
  absl::StatusOr<ClientConnection> shards = ClientConnectionFromFlags(/*needs_shards=*/false, ClientKind::kTool);
  if (!shards.ok()) return Fail(std::string(shards.status().message()));
  // Exactly one source. A --cluster spec always names the shards: there --checkpoint_dir wins.
  const bool from_spec = !parsed->spec_summary.empty();
  const bool both = !dir.empty() && !shards->addresses.empty() && !from_spec;
  const bool neither = dir.empty() && shards->addresses.empty();
  if (both || neither) return Fail("give either --checkpoint_dir or --ps");
  if (out.empty()) return Fail("--out is required");
  const std::string model = shards->model;
  const absl::Time start = absl::Now();
  absl::StatusOr<ModelFile> file = dir.empty()
                                       ? ModelFromShards(shards->addresses, model, shards->options)
                                       : ModelFromCheckpoints(dir, model);
  if (!file.ok()) return Fail(std::string(file.status().message()));
  absl::StatusOr<std::string> wrote = WriteExport(out, *file, start);
  if (!wrote.ok()) return Fail(std::string(wrote.status().message()));
  std::printf("%s\n", wrote->c_str());
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
