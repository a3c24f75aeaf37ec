// A model given as named tensors, such as a PyTorch module's parameters, rather than as one of the
// networks this project builds itself (common/network_spec.h). Written as JSON, inline or in a
// file, wherever a model spec is taken (ps --model, the cluster spec's "model", export_model):
//
//   {"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
//                {"name": "conv1.bias", "shape": [16]}, ...,
//                {"name": "bn1.running_mean", "shape": [16], "buffer": true}, ...]}
//
// The tensors lie back to back in the flat vector in the order listed, each row-major (C order,
// PyTorch's contiguous layout), so a module's named_parameters() in order are its layout. Values
// are float32. Buffers (PyTorch's module buffers, such as BatchNorm's running statistics) come
// after all parameters: the shards hold and export them but do not train them (a push carries
// their values, which replace the shard's, or under sync their average does). Free functions and
// plain values: safe to use from several threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

// A named tensor inside the flat parameter vector.
struct TensorSlot {
  std::string name;
  std::vector<int64_t> shape;  // empty: a scalar (one value)
  int64_t offset = 0;
  int64_t size = 0;
  bool buffer = false;  // held, not trained (see above)
};

struct TensorLayout {
  std::vector<TensorSlot> tensors;  // in flat order, offsets back to back from 0

  int64_t num_params() const;
  // The values at the end that are buffers, not trained.
  int64_t num_buffer_values() const;
  // The layout as compact JSON with keys in a fixed order, the same text for every equal layout
  // however it was written: the canonical spec that travels in flags and cluster specs.
  std::string ToJson() const;
  // "layout:N:HHHHHHHHHHHHHHHH", N the parameter count and H a 64-bit FNV-1a hash of ToJson(): what
  // shards and clients compare (it travels in every pull, so it is short). Two layouts differing
  // in a name, a shape or the order get different fingerprints.
  std::string Fingerprint() const;
};

// True when `spec` is a layout rather than a named model: inline JSON (its first non-blank
// character is '{') or a file whose name ends in ".json".
bool IsLayoutSpec(const std::string& spec);
// True when `spec` is an inline layout (its first non-blank character is '{').
bool IsInlineLayout(const std::string& spec);

// Names the first tensor whose name, shape, position or kind (a buffer or not) differs between
// layouts `a` and `b`, as "<a_name> has conv1.weight [16,1,5,5] at position 0 where <b_name> has
// conv1.weight [6,1,5,5]" (a buffer: "bn1.running_mean [16] (a buffer)"; "no tensor (it has
// N)" where one layout has fewer); "" when they are equal.
std::string LayoutDifference(const TensorLayout& a, absl::string_view a_name, const TensorLayout& b,
                             absl::string_view b_name);

// Parses inline JSON or reads the file (at most 16 MiB). Fails with NOT_FOUND naming a missing
// file, and INVALID_ARGUMENT naming the problem otherwise: not JSON, keys other than "tensors"
// (and, per tensor, "name" and "shape"), no tensors, a name empty, longer than 256 bytes, holding
// control characters, repeated or "__metadata__" (safetensors' own key), a dimension < 1, more
// than 2^40 parameters in all, a "buffer" that is not a boolean, a parameter after a buffer.
absl::StatusOr<TensorLayout> ParseTensorLayout(const std::string& spec);

}  // namespace ps
