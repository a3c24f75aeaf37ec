// A trained model as one safetensors file (common/safetensors.h) under the model's own tensor
// names, for use outside this system: `export_model` writes it, `evaluator --model_file` scores
// it, and NumPy or PyTorch read it (tools/score_model.py, paramserver.torch.load_file).
//
// Tensors, in ModelTensors(spec) order, so the file's data section is the flat parameter vector:
// a tensor layout's own names and shapes (a PyTorch module's: load_state_dict takes them as they
// are), flat:N's "params" [N], and for the networks this project builds:
//   fc<l>.weight [in, out]  row-major; layer l computes y = x W + b for a row vector x (PyTorch's
//                           nn.Linear keeps [out, in]: load its weight as W.T)
//   fc<l>.bias   [out]
//   conv<l>.weight [K, K, C_in, C_out], conv<l>.bias [C_out]
// Metadata (strings): "format" = "ps.model.v1", "model" (the model's fingerprint: the spec of a
// network, "mlp:784-256-128-10"; a layout's "layout:N:HASH"), "versions" (JSON list: the version
// of each shard the values came from, in shard order), "file_crc32" (of the whole file:
// common/safetensors.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps {

struct ModelFile {
  std::string model;              // a model spec (common/model_spec.h), "mlp:784-256-128-10"
  std::vector<int64_t> versions;  // of the shards the values came from, in shard order; not empty
  std::vector<float> params;      // the flat vector, laid out as ModelTensors(model) says
};

// Writes `file` to `path` atomically (see WriteSafetensors). Fails with INVALID_ARGUMENT if
// file.model is not a model spec, file.params is not of its size or file.versions is empty, and
// naming the file and the system error if it cannot be written.
absl::Status WriteModelFile(const std::string& path, const ModelFile& file);

// Reads a file written by WriteModelFile that must hold `expected_model` (a model spec; the file
// must carry its fingerprint). Fails with NOT_FOUND if there is no such file, DATA_LOSS if it is
// torn or corrupt, and INVALID_ARGUMENT naming the problem if it is not a model file (a shard
// checkpoint, say), holds another model, or lacks a tensor, has one too many or one of the wrong
// shape.
absl::StatusOr<ModelFile> ReadModelFile(const std::string& path, const std::string& expected_model);

}  // namespace ps
