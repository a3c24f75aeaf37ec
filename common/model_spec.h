// The model a job trains, as a spec string every daemon is given (ps --model=..., the workers
// derive theirs from their flags): enough for a shard to know, before any client speaks, exactly
// how many parameters the job has and which range of them it owns.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_identity.h"
#include "common/tensor_layout.h"

namespace ps {

// Parses a model spec into the identity shards and clients compare:
//   "mlp:IN-H1-...-OUT"  dense layers (weights and biases), e.g. mlp:784-256-128-10
//   "cnn:CxHxW-..."      a convolutional network (grammar and presets in common/network_spec.h)
//   "flat:N"             a bare vector of N parameters (tests and benchmarks)
//   "{...}" or "F.json"  named tensors, inline or in a file (common/tensor_layout.h)
// The fingerprint is the spec itself in canonical form, a layout's TensorLayout::Fingerprint()
// (and its canonical JSON the identity's `layout`).
// Fails naming the bad part on anything else, on sizes < 1, on a model of more than 2^40
// parameters, or (NOT_FOUND) on a layout file that is not there.
absl::StatusOr<ModelIdentity> ParseModelSpec(const std::string& spec, int num_shards);

// The canonical spec of a --model flag (anything ParseModelSpec takes, or a preset) or, when it
// is empty, of the MLP of a --hidden flag: what travels on to other processes. A layout file
// becomes its inline JSON, so that the reader needs no file. Fails as ParseModelSpec does, or
// naming a bad --hidden entry.
absl::StatusOr<std::string> ResolveModelSpec(const std::string& model, const std::string& hidden);

// The named tensors of any model spec, back to back in flat order: a network's TensorSlots, a
// layout's tensors, and for flat:N one tensor "params" [N]. Fails as ParseModelSpec does.
absl::StatusOr<std::vector<TensorSlot>> ModelTensors(const std::string& spec);

// Layer sizes {inputs, hidden..., classes} of an "mlp:..." spec, the inverse of MlpSpec. Fails as
// ParseModelSpec does, and on a flat:N spec or a layer wider than 2^31-1.
absl::StatusOr<std::vector<int>> ParseMlpSpec(const std::string& spec);

// Layer sizes {inputs, hidden..., classes} from a --hidden flag such as "256,128" (may be empty
// for softmax regression). Fails naming a non-numeric or non-positive entry.
absl::StatusOr<std::vector<int>> MlpLayerSizes(int inputs, const std::string& hidden, int classes);

// The spec of an MLP with these layer sizes: "mlp:784-256-128-10".
std::string MlpSpec(const std::vector<int>& sizes);

}  // namespace ps
