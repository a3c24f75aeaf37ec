// A feed-forward network (common/network_spec.h: dense layers, or convolutions and max-pooling
// followed by dense layers; ReLU; softmax cross-entropy) written once against the Backend
// interface: an MLP is the network of dense layers only. Its parameters are one flat float vector
// laid out as TensorSlots(spec) says. Activations are NHWC; a convolution is Im2Col + Gemm. Not
// thread-safe.
//
// A training step waits on the backend once: the parameters go up, the kernels run (on CUDA, as
// one recorded graph per batch size), the gradient and the loss come down, all queued, and then
// one Synchronize. Host buffers from Backend::AllocateHost (HostBuffer) make those copies
// full-speed DMA on a GPU; other memory works too, more slowly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/network_spec.h"
#include "kernels/backend.h"

namespace ps {

class Network {
 public:
  // `max_batch` bounds the rows of any later call. REQUIRES: spec from ParseNetworkSpec; backend
  // outlives this.
  Network(NetworkSpec spec, int max_batch, Backend* backend);

  const NetworkSpec& spec() const { return spec_; }
  const std::vector<TensorSlot>& tensors() const { return tensors_; }
  int64_t num_params() const { return num_params_; }
  int num_inputs() const { return static_cast<int>(spec_.input_size()); }
  int num_classes() const { return spec_.classes(); }
  // Identifies the architecture on the wire, e.g. "mlp:784-256-128-10".
  std::string Fingerprint() const { return spec_.ToString(); }

  // He-normal weights (std = sqrt(2 / fan_in), fan_in = K*K*C_in for a convolution) and zero
  // biases, from `seed`.
  std::vector<float> InitialParams(uint64_t seed) const;

  // Mean loss of a minibatch; writes d(loss)/d(params) to `grad` (num_params() floats).
  // `inputs` is [rows, num_inputs()] row-major host memory; rows <= max_batch. A label outside
  // [0, num_classes()) aborts, naming the row (datasets are checked when they are read).
  float Gradient(absl::Span<const float> params, const float* inputs, const int32_t* labels,
                 int rows, absl::Span<float> grad);

  // Copies a training set into backend memory once ([count, num_inputs()] features), so that
  // GradientOfExamples sends only the batch's indices each step.
  void SetTrainingSet(const float* features, const int32_t* labels, int64_t count);
  // As Gradient, for the training-set rows named by `indices` (rows of them).
  // REQUIRES: SetTrainingSet was called; every index < its count.
  float GradientOfExamples(absl::Span<const float> params, const int32_t* indices, int rows,
                           absl::Span<float> grad);

  // What a step computed layer by layer tells its caller, so that communication overlaps it
  // (trainer/overlapped_step.h): the forward pass asks for each layer's weights only as it reaches
  // that layer, and the backward pass hands each layer's gradient over as soon as it is final,
  // last layer first. The parameters' layout (tensors()) is in layer order, so both are prefixes
  // and suffixes of the flat vector.
  struct LayerHooks {
    // Before a layer's forward pass: returns once params[0, end) hold the step's weights. An
    // error ends the step with it.
    std::function<absl::Status(int64_t end)> weights_needed = nullptr;
    // After a layer's backward pass: grad[begin, num_params()) is final. An error ends the step.
    std::function<absl::Status(int64_t begin)> gradient_final = nullptr;
  };
  // As GradientOfExamples, computed layer by layer around `hooks` (each layer's weights go to the
  // backend as they are ready, and its gradient comes back as soon as it is done, one Synchronize
  // per layer instead of one per step: on CUDA, no recorded graph). The loss and gradient are the
  // same as GradientOfExamples'. Fails with the first error a hook returned; the backend is idle
  // again then.
  absl::StatusOr<float> GradientOfExamples(absl::Span<const float> params, const int32_t* indices,
                                           int rows, absl::Span<float> grad,
                                           const LayerHooks& hooks);

  // Loss and correct predictions over a dataset, in batches of max_batch. If `stop` is given and
  // returns true before a batch, scoring ends there: `rows` says how many examples were scored.
  struct Score {
    double loss = 0;
    double accuracy = 0;
    int64_t rows = 0;
  };
  Score Evaluate(absl::Span<const float> params, const float* inputs, const int32_t* labels,
                 int64_t rows, const std::function<bool()>& stop = nullptr);

 private:
  // Queues the forward pass on `rows` rows already in inputs_ and labels_, its loss summary into
  // loss_ and, if want_grad, d(loss)/d(logits) into the delta buffer QueueBackward starts from.
  // With `hooks` (LayerHooks), each layer's weights are uploaded from `params` once
  // weights_needed returned.
  absl::Status QueueForward(int rows, bool want_grad, const LayerHooks* hooks = nullptr,
                            absl::Span<const float> params = {});
  // Queues the backward pass after QueueForward(rows, true): the gradient into grad_. With `hooks`
  // and `grad`, each layer's gradient is downloaded into `grad` and waited for, then announced.
  absl::Status QueueBackward(int rows, const LayerHooks* hooks = nullptr,
                             absl::Span<float> grad = {});
  // Queues the gather of the training-set rows `indices` into inputs_ and labels_.
  void LoadExamples(const int32_t* indices, int rows);
  // Gradient of the batch already queued into inputs_ and labels_; layer by layer with `hooks`.
  absl::StatusOr<float> GradientOfLoadedBatch(absl::Span<const float> params, int rows,
                                              absl::Span<float> grad,
                                              const LayerHooks* hooks = nullptr);
  // The flat range [begin, end) of layer l's weight and bias. REQUIRES: slot_of_[l] >= 0.
  std::pair<int64_t, int64_t> ParamsOf(int l) const;
  // Downloads the loss summary, waits for everything queued, and returns the summary; aborts
  // naming the row (first_row + the batch's row) when a label was out of range.
  Backend::LossSummary Finish(int64_t first_row = 0);
  // Layer l's input: the network's input or layer l-1's output.
  const float* Input(int l) const;
  Backend::ConvShape ConvShapeOf(int l, int rows) const;

  NetworkSpec spec_;
  int max_batch_;
  Backend* backend_;
  std::vector<TensorSlot> tensors_;
  std::vector<int> slot_of_;  // [l] = index in tensors_ of layer l's weight (-1: pooling)
  int64_t num_params_ = 0;
  DeviceBuffer<float> params_, grad_, inputs_;
  DeviceBuffer<int32_t> labels_, batch_index_;
  DeviceBuffer<float> train_features_;  // SetTrainingSet's copy
  DeviceBuffer<int32_t> train_labels_;
  std::vector<DeviceBuffer<float>> activations_;  // [l] = output of layer l, [rows, out_size]
  std::vector<DeviceBuffer<int32_t>> argmax_;     // [l] = pooling layer l's argmax, else empty
  DeviceBuffer<float> cols_;                      // Im2Col scratch, the widest convolution's
  DeviceBuffer<float> delta_a_, delta_b_;         // backward scratch, [rows, widest activation]
  DeviceBuffer<Backend::LossSummary> loss_;
  HostBuffer<Backend::LossSummary> loss_host_;
  HostBuffer<int32_t> index_staging_;  // GradientOfExamples' indices, [max_batch], pinned
  // The recorded forward + backward pass, by batch size (each records its pointers, all owned
  // here). Declared last: destroyed first.
  std::map<int, std::unique_ptr<Backend::Recording>> step_recordings_;
};

}  // namespace ps
