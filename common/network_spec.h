// The architecture of a feed-forward network, parsed from a model spec, and the layout of its
// parameters in the flat vector the shards hold. Shared by the shards (how many parameters) and
// the clients (the network they build, the tensors of model files).
//
// Grammar (a small one; sizes are positive integers):
//   mlp:IN-H1-...-OUT                   dense layers, e.g. mlp:784-256-128-10
//   cnn:CxHxW-LAYER-...-OUT             an input of C channels of H x W, then layers:
//       convO[kK][sS][pP]   O output channels, a K x K kernel (3), stride S (1), zero padding P
//                           (K/2: "same" for odd K at stride 1)
//       poolN               N x N max-pooling, stride N
//       fcN                 a dense layer of N units (after it only dense layers)
//     and OUT, the classes (a dense layer). Conv and dense layers but the last are followed by
//     ReLU. E.g. cnn:1x28x28-conv32k5-pool2-conv64k5-pool2-fc128-10.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor_layout.h"

namespace ps {

struct LayerSpec {
  enum class Kind { kConv, kPool, kDense };
  Kind kind = Kind::kDense;
  int size = 0;                         // conv: output channels; pool: window; dense: units
  int kernel = 1, stride = 1, pad = 0;  // conv
  bool relu = false;                    // conv and every dense layer but the last
  // The input this layer sees and the output it makes (NHWC; a dense layer's is 1 x 1 x units).
  int in_height = 1, in_width = 1, in_channels = 0;
  int out_height = 1, out_width = 1, out_channels = 0;
  int64_t in_size() const { return int64_t{in_height} * in_width * in_channels; }
  int64_t out_size() const { return int64_t{out_height} * out_width * out_channels; }
  int64_t num_weights() const;  // 0 for pooling
};

struct NetworkSpec {
  bool convolutional = false;  // written as cnn:..., else mlp:...
  std::vector<LayerSpec> layers;
  int64_t input_size() const { return layers.front().in_size(); }
  int classes() const { return layers.back().size; }
  int64_t num_params() const;
  // The canonical spec (defaults left out), which is also the model's fingerprint.
  std::string ToString() const;
  // OK when every matrix and index of a batch of `batch` examples fits an int (the kernels'
  // sizes); else INVALID_ARGUMENT naming the layer.
  absl::Status FitsBatch(int batch) const;
  // OK when the network takes Fashion-MNIST's examples (784 values: 784 inputs or 1x28x28) and
  // gives its 10 classes; else INVALID_ARGUMENT saying what differs.
  absl::Status FitsFashionMnist() const;
};

// Parses an mlp:... or cnn:... spec. Fails naming the bad part: an unknown layer, a size out of
// range, a shape that vanishes (a kernel or pool larger than its input), a conv or pool after a
// dense layer, an activation of more than 2^31 - 1 values per example, more than 2^40
// parameters.
absl::StatusOr<NetworkSpec> ParseNetworkSpec(const std::string& spec);

// Named models for Fashion-MNIST (28 x 28 grey images, 10 classes), usable wherever a spec is:
//   cnn-small  cnn:1x28x28-conv16k5-pool2-conv32k5-pool2-fc128-10     (215k parameters)
//   cnn-large  cnn:1x28x28-conv32k3-conv32k3-pool2-conv64k3-conv64k3-pool2-fc256-10 (871k)
// The network a job trains, from a --model flag (a spec or a preset name) or, when that is
// empty, from --hidden (an MLP from Fashion-MNIST's 784 inputs to its 10 classes). Fails as
// ParseNetworkSpec does, or naming a bad --hidden entry.
absl::StatusOr<NetworkSpec> ResolveModel(const std::string& model, const std::string& hidden);

// The MLP with layer sizes {inputs, hidden..., classes}, as ParseNetworkSpec(MlpSpec(sizes)) would
// give it. REQUIRES: at least two sizes, all positive.
NetworkSpec MlpNetwork(const std::vector<int>& sizes);

// The flat layout, tensors back to back from offset 0 in layer order: for conv layer i (from 1)
// "convi.weight" [K, K, C_in, C_out] (row-major, so as a matrix [K*K*C_in, C_out], the order of
// Backend::Im2Col's columns) and "convi.bias" [C_out]; for dense layer j (from 1) "fcj.weight"
// [in, out] (a layer computes x W + b, with x a row vector; after convolutions x is the NHWC
// activation flattened) and "fcj.bias" [out].
std::vector<TensorSlot> TensorSlots(const NetworkSpec& spec);

}  // namespace ps
