#include "worker/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log.h"

namespace ps {

std::vector<TensorSlot> MlpTensorSlots(const std::vector<int>& layer_sizes) {
  std::vector<TensorSlot> slots;
  int64_t offset = 0;
  for (size_t l = 0; l + 1 < layer_sizes.size(); ++l) {
    std::string prefix = "fc" + std::to_string(l + 1);
    int64_t in = layer_sizes[l], out = layer_sizes[l + 1];
    slots.push_back({prefix + ".weight", {in, out}, offset, in * out});
    offset += in * out;
    slots.push_back({prefix + ".bias", {out}, offset, out});
    offset += out;
  }
  return slots;
}

Mlp::Mlp(std::vector<int> layer_sizes, int max_batch, Backend* backend)
    : sizes_(std::move(layer_sizes)),
      max_batch_(max_batch),
      backend_(backend),
      tensors_(MlpTensorSlots(sizes_)),
      num_params_(tensors_.back().offset + tensors_.back().size),
      loss_(backend, 1),
      loss_host_(backend, 1),
      index_staging_(backend, max_batch) {
  int widest = 0;
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
    activations_.emplace_back(backend_, static_cast<size_t>(max_batch) * sizes_[l + 1]);
    widest = std::max<int>(widest, sizes_[l + 1]);
  }
  widest = std::max(widest, sizes_.front());
  params_ = DeviceBuffer<float>(backend_, num_params_);
  grad_ = DeviceBuffer<float>(backend_, num_params_);
  inputs_ = DeviceBuffer<float>(backend_, static_cast<size_t>(max_batch) * sizes_.front());
  labels_ = DeviceBuffer<int32_t>(backend_, max_batch);
  batch_index_ = DeviceBuffer<int32_t>(backend_, max_batch);
  delta_a_ = DeviceBuffer<float>(backend_, static_cast<size_t>(max_batch) * widest);
  delta_b_ = DeviceBuffer<float>(backend_, static_cast<size_t>(max_batch) * widest);
}

std::string Mlp::Fingerprint() const { return MlpSpec(sizes_); }

std::vector<float> Mlp::InitialParams(uint64_t seed) const {
  std::vector<float> p(num_params_, 0.0f);
  std::mt19937_64 rng(seed);
  for (const TensorSlot& t : tensors_) {
    if (t.shape.size() != 2) continue;  // biases start at zero
    std::normal_distribution<float> normal(0.0f, std::sqrt(2.0f / t.shape[0]));
    for (int64_t i = 0; i < t.size; ++i) p[t.offset + i] = normal(rng);
  }
  return p;
}

const float* Mlp::Weight(int layer) const { return params_.data() + tensors_[2 * layer].offset; }
const float* Mlp::Bias(int layer) const { return params_.data() + tensors_[2 * layer + 1].offset; }

void Mlp::QueueForward(int rows, bool want_grad) {
  int layers = static_cast<int>(sizes_.size()) - 1;
  const float* x = inputs_.data();
  for (int l = 0; l < layers; ++l) {
    float* z = activations_[l].data();
    backend_->Gemm(false, false, rows, sizes_[l + 1], sizes_[l], 1.0f, x, Weight(l), 0.0f, z);
    backend_->AddBiasActivate(z, Bias(l), rows, sizes_[l + 1], /*relu=*/l + 1 < layers);
    x = z;
  }
  backend_->SoftmaxCrossEntropy(x, labels_.data(), rows, sizes_.back(),
                                want_grad ? delta_a_.data() : nullptr, loss_.data());
}

void Mlp::QueueBackward(int rows) {
  // delta holds d(loss)/d(pre-activation) of layer l, [rows, sizes_[l+1]].
  float* delta = delta_a_.data();
  float* spare = delta_b_.data();
  for (int l = static_cast<int>(sizes_.size()) - 2; l >= 0; --l) {
    const float* layer_input = l == 0 ? inputs_.data() : activations_[l - 1].data();
    float* dw = grad_.data() + tensors_[2 * l].offset;
    float* db = grad_.data() + tensors_[2 * l + 1].offset;
    backend_->Gemm(true, false, sizes_[l], sizes_[l + 1], rows, 1.0f, layer_input, delta, 0.0f, dw);
    backend_->ColumnSum(delta, rows, sizes_[l + 1], db);
    if (l > 0) {
      backend_->Gemm(false, true, rows, sizes_[l], sizes_[l + 1], 1.0f, delta, Weight(l), 0.0f,
                     spare);
      backend_->ReluBackward(spare, activations_[l - 1].data(),
                             static_cast<int64_t>(rows) * sizes_[l]);
      std::swap(delta, spare);
    }
  }
}

Backend::LossSummary Mlp::Finish(int64_t first_row) {
  loss_.DownloadAsync(loss_host_.data(), 1);
  backend_->Synchronize();
  const Backend::LossSummary summary = *loss_host_.data();
  if (summary.first_bad_row >= 0) {
    PS_LOG(ERROR) << "Mlp: the label of row " << first_row + summary.first_bad_row
                  << " is outside [0, " << num_classes() << ")";
    std::abort();
  }
  return summary;
}

float Mlp::Gradient(absl::Span<const float> params, const float* inputs, const int32_t* labels,
                    int rows, absl::Span<float> grad) {
  inputs_.UploadAsync(inputs, static_cast<size_t>(rows) * sizes_.front());
  labels_.UploadAsync(labels, rows);
  return GradientOfLoadedBatch(params, rows, grad);
}

void Mlp::SetTrainingSet(const float* features, const int32_t* labels, int64_t count) {
  train_features_ = DeviceBuffer<float>(backend_, static_cast<size_t>(count) * sizes_.front());
  train_features_.Upload(features, train_features_.size());
  train_labels_ = DeviceBuffer<int32_t>(backend_, count);
  train_labels_.Upload(labels, count);
}

float Mlp::GradientOfExamples(absl::Span<const float> params, const int32_t* indices, int rows,
                              absl::Span<float> grad) {
  std::copy(indices, indices + rows, index_staging_.data());  // the previous step's copy is done
  batch_index_.UploadAsync(index_staging_.data(), rows);
  backend_->GatherRows(train_features_.data(), batch_index_.data(), rows,
                       sizes_.front() * sizeof(float), inputs_.data());
  backend_->GatherRows(train_labels_.data(), batch_index_.data(), rows, sizeof(int32_t),
                       labels_.data());
  return GradientOfLoadedBatch(params, rows, grad);
}

float Mlp::GradientOfLoadedBatch(absl::Span<const float> params, int rows, absl::Span<float> grad) {
  params_.UploadAsync(params.data(), num_params_);
  backend_->RunRecorded(&step_recordings_[rows], [&] {
    QueueForward(rows, /*want_grad=*/true);
    QueueBackward(rows);
  });
  grad_.DownloadAsync(grad.data(), num_params_);
  return static_cast<float>(Finish().loss_sum / rows);
}

Mlp::Score Mlp::Evaluate(absl::Span<const float> params, const float* inputs, const int32_t* labels,
                         int64_t rows) {
  params_.UploadAsync(params.data(), num_params_);
  double loss_sum = 0;
  int64_t correct_sum = 0;
  for (int64_t start = 0; start < rows; start += max_batch_) {
    int n = static_cast<int>(std::min<int64_t>(max_batch_, rows - start));
    inputs_.UploadAsync(inputs + start * sizes_.front(), static_cast<size_t>(n) * sizes_.front());
    labels_.UploadAsync(labels + start, n);
    QueueForward(n, /*want_grad=*/false);
    Backend::LossSummary summary = Finish(start);
    loss_sum += summary.loss_sum;
    correct_sum += summary.hits;
  }
  return Score{loss_sum / std::max<int64_t>(rows, 1),
               static_cast<double>(correct_sum) / std::max<int64_t>(rows, 1)};
}

}  // namespace ps
