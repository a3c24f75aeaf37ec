#include "trainer/network.h"

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

Network::Network(NetworkSpec spec, int max_batch, Backend* backend)
    : spec_(std::move(spec)),
      max_batch_(max_batch),
      backend_(backend),
      tensors_(TensorSlots(spec_)),
      num_params_(spec_.num_params()),
      loss_(backend, 1),
      loss_host_(backend, 1),
      index_staging_(backend, max_batch) {
  const size_t batch = static_cast<size_t>(max_batch);
  int64_t widest = spec_.input_size(), cols = 0;
  int slot = 0;
  for (const LayerSpec& l : spec_.layers) {
    activations_.emplace_back(backend_, batch * l.out_size());
    widest = std::max(widest, l.out_size());
    if (l.kind == LayerSpec::Kind::kPool) {
      argmax_.emplace_back(backend_, batch * l.out_size());
      slot_of_.push_back(-1);
      continue;
    }
    argmax_.emplace_back();
    slot_of_.push_back(slot);
    slot += 2;
    if (l.kind == LayerSpec::Kind::kConv) {
      cols =
          std::max(cols, int64_t{l.out_height} * l.out_width * l.kernel * l.kernel * l.in_channels);
    }
  }
  params_ = DeviceBuffer<float>(backend_, num_params_);
  grad_ = DeviceBuffer<float>(backend_, num_params_);
  inputs_ = DeviceBuffer<float>(backend_, batch * spec_.input_size());
  labels_ = DeviceBuffer<int32_t>(backend_, max_batch);
  batch_index_ = DeviceBuffer<int32_t>(backend_, max_batch);
  if (cols > 0) cols_ = DeviceBuffer<float>(backend_, batch * cols);
  delta_a_ = DeviceBuffer<float>(backend_, batch * widest);
  delta_b_ = DeviceBuffer<float>(backend_, batch * widest);
}

std::vector<float> Network::InitialParams(uint64_t seed) const {
  std::vector<float> p(num_params_, 0.0f);
  std::mt19937_64 rng(seed);
  for (const TensorSlot& t : tensors_) {
    if (t.shape.size() < 2) continue;  // biases start at zero
    const int64_t fan_in = t.size / t.shape.back();
    std::normal_distribution<float> normal(0.0f, std::sqrt(2.0f / fan_in));
    for (int64_t i = 0; i < t.size; ++i) p[t.offset + i] = normal(rng);
  }
  return p;
}

const float* Network::Input(int l) const {
  return l == 0 ? inputs_.data() : activations_[l - 1].data();
}

Backend::ConvShape Network::ConvShapeOf(int l, int rows) const {
  const LayerSpec& layer = spec_.layers[l];
  return {.batch = rows,
          .height = layer.in_height,
          .width = layer.in_width,
          .channels = layer.in_channels,
          .kernel = layer.kernel,
          .stride = layer.stride,
          .pad = layer.pad};
}

std::pair<int64_t, int64_t> Network::ParamsOf(int l) const {
  const TensorSlot& bias = tensors_[slot_of_[l] + 1];
  return {tensors_[slot_of_[l]].offset, bias.offset + bias.size};
}

absl::Status Network::QueueForward(int rows, bool want_grad, const LayerHooks* hooks,
                                   absl::Span<const float> params) {
  for (int l = 0; l < static_cast<int>(spec_.layers.size()); ++l) {
    const LayerSpec& layer = spec_.layers[l];
    const float* x = Input(l);
    float* y = activations_[l].data();
    if (layer.kind == LayerSpec::Kind::kPool) {
      backend_->MaxPool(x, rows, layer.in_height, layer.in_width, layer.in_channels, layer.size, y,
                        argmax_[l].data());
      continue;
    }
    if (hooks != nullptr) {
      const auto [begin, end] = ParamsOf(l);
      if (absl::Status s = hooks->weights_needed(end); !s.ok()) return s;
      params_.UploadAsync(params.data() + begin, end - begin, begin);
    }
    const float* w = params_.data() + tensors_[slot_of_[l]].offset;
    const float* b = params_.data() + tensors_[slot_of_[l] + 1].offset;
    int pixels = rows;  // rows of the layer's matrix product: examples, or examples x pixels
    if (layer.kind == LayerSpec::Kind::kConv) {
      const Backend::ConvShape s = ConvShapeOf(l, rows);
      backend_->Im2Col(x, s, cols_.data());
      pixels = static_cast<int>(s.rows());
      backend_->Gemm(false, false, pixels, layer.size, static_cast<int>(s.cols()), 1.0f,
                     cols_.data(), w, 0.0f, y);
    } else {
      backend_->Gemm(false, false, rows, layer.size, static_cast<int>(layer.in_size()), 1.0f, x, w,
                     0.0f, y);
    }
    backend_->AddBiasActivate(y, b, pixels, layer.size, layer.relu);
  }
  backend_->SoftmaxCrossEntropy(activations_.back().data(), labels_.data(), rows, num_classes(),
                                want_grad ? delta_a_.data() : nullptr, loss_.data());
  return absl::OkStatus();
}

absl::Status Network::QueueBackward(int rows, const LayerHooks* hooks, absl::Span<float> grad) {
  // delta holds d(loss)/d(layer l's output, before its ReLU), [rows, out_size].
  float* delta = delta_a_.data();
  float* spare = delta_b_.data();
  for (int l = static_cast<int>(spec_.layers.size()) - 1; l >= 0; --l) {
    const LayerSpec& layer = spec_.layers[l];
    const float* x = Input(l);
    if (layer.kind == LayerSpec::Kind::kPool) {
      if (l > 0) {
        backend_->MaxPoolBackward(delta, argmax_[l].data(), rows * layer.out_size(),
                                  rows * layer.in_size(), spare);
      }
    } else {
      const float* w = params_.data() + tensors_[slot_of_[l]].offset;
      float* dw = grad_.data() + tensors_[slot_of_[l]].offset;
      float* db = grad_.data() + tensors_[slot_of_[l] + 1].offset;
      if (layer.kind == LayerSpec::Kind::kConv) {
        const Backend::ConvShape s = ConvShapeOf(l, rows);
        const int pixels = static_cast<int>(s.rows()), window = static_cast<int>(s.cols());
        backend_->Im2Col(x, s, cols_.data());  // recomputed: one scratch serves every layer
        backend_->Gemm(true, false, window, layer.size, pixels, 1.0f, cols_.data(), delta, 0.0f,
                       dw);
        backend_->ColumnSum(delta, pixels, layer.size, db);
        if (l > 0) {
          backend_->Gemm(false, true, pixels, window, layer.size, 1.0f, delta, w, 0.0f,
                         cols_.data());
          backend_->Col2Im(cols_.data(), s, spare);
        }
      } else {
        const int in = static_cast<int>(layer.in_size());
        backend_->Gemm(true, false, in, layer.size, rows, 1.0f, x, delta, 0.0f, dw);
        backend_->ColumnSum(delta, rows, layer.size, db);
        if (l > 0) backend_->Gemm(false, true, rows, in, layer.size, 1.0f, delta, w, 0.0f, spare);
      }
      if (hooks != nullptr) {  // the layer's gradient is done: hand it over, then go on
        const auto [begin, end] = ParamsOf(l);
        grad_.DownloadAsync(grad.data() + begin, end - begin, begin);
        backend_->Synchronize();
        if (absl::Status s = hooks->gradient_final(begin); !s.ok()) return s;
      }
    }
    if (l > 0) {
      if (spec_.layers[l - 1].relu) {
        backend_->ReluBackward(spare, activations_[l - 1].data(), rows * layer.in_size());
      }
      std::swap(delta, spare);
    }
  }
  return absl::OkStatus();
}

Backend::LossSummary Network::Finish(int64_t first_row) {
  loss_.DownloadAsync(loss_host_.data(), 1);
  backend_->Synchronize();
  const Backend::LossSummary summary = *loss_host_.data();
  if (summary.first_bad_row >= 0) {
    PS_LOG(ERROR) << "Network: the label of row " << first_row + summary.first_bad_row
                  << " is outside [0, " << num_classes() << ")";
    std::abort();
  }
  return summary;
}

float Network::Gradient(absl::Span<const float> params, const float* inputs, const int32_t* labels,
                        int rows, absl::Span<float> grad) {
  inputs_.UploadAsync(inputs, static_cast<size_t>(rows) * spec_.input_size());
  labels_.UploadAsync(labels, rows);
  return *GradientOfLoadedBatch(params, rows, grad);  // fails only through hooks
}

void Network::SetTrainingSet(const float* features, const int32_t* labels, int64_t count) {
  train_features_ = DeviceBuffer<float>(backend_, static_cast<size_t>(count) * spec_.input_size());
  train_features_.Upload(features, train_features_.size());
  train_labels_ = DeviceBuffer<int32_t>(backend_, count);
  train_labels_.Upload(labels, count);
}

void Network::LoadExamples(const int32_t* indices, int rows) {
  std::copy(indices, indices + rows, index_staging_.data());  // the previous step's copy is done
  batch_index_.UploadAsync(index_staging_.data(), rows);
  backend_->GatherRows(train_features_.data(), batch_index_.data(), rows,
                       spec_.input_size() * sizeof(float), inputs_.data());
  backend_->GatherRows(train_labels_.data(), batch_index_.data(), rows, sizeof(int32_t),
                       labels_.data());
}

float Network::GradientOfExamples(absl::Span<const float> params, const int32_t* indices, int rows,
                                  absl::Span<float> grad) {
  LoadExamples(indices, rows);
  return *GradientOfLoadedBatch(params, rows, grad);  // fails only through hooks
}

absl::StatusOr<float> Network::GradientOfExamples(absl::Span<const float> params,
                                                  const int32_t* indices, int rows,
                                                  absl::Span<float> grad, const LayerHooks& hooks) {
  LoadExamples(indices, rows);
  return GradientOfLoadedBatch(params, rows, grad, &hooks);
}

absl::StatusOr<float> Network::GradientOfLoadedBatch(absl::Span<const float> params, int rows,
                                                     absl::Span<float> grad,
                                                     const LayerHooks* hooks) {
  if (hooks != nullptr) {
    absl::Status s = QueueForward(rows, /*want_grad=*/true, hooks, params);
    if (s.ok()) s = QueueBackward(rows, hooks, grad);
    if (!s.ok()) {
      backend_->Synchronize();  // nothing queued may outlive the step
      return s;
    }
  } else {
    params_.UploadAsync(params.data(), num_params_);
    backend_->RunRecorded(&step_recordings_[rows], [&] {
      QueueForward(rows, /*want_grad=*/true).IgnoreError();  // no hooks: never fails
      QueueBackward(rows).IgnoreError();
    });
    grad_.DownloadAsync(grad.data(), num_params_);
  }
  return static_cast<float>(Finish().loss_sum / rows);
}

Network::Score Network::Evaluate(absl::Span<const float> params, const float* inputs,
                                 const int32_t* labels, int64_t rows,
                                 const std::function<bool()>& stop) {
  params_.UploadAsync(params.data(), num_params_);
  double loss_sum = 0;
  int64_t correct_sum = 0, scored = 0;
  for (; scored < rows && !(stop && stop()); scored += max_batch_) {
    int n = static_cast<int>(std::min<int64_t>(max_batch_, rows - scored));
    inputs_.UploadAsync(inputs + scored * spec_.input_size(),
                        static_cast<size_t>(n) * spec_.input_size());
    labels_.UploadAsync(labels + scored, n);
    QueueForward(n, /*want_grad=*/false).IgnoreError();  // no hooks: never fails
    Backend::LossSummary summary = Finish(scored);
    loss_sum += summary.loss_sum;
    correct_sum += summary.hits;
  }
  scored = std::min(scored, rows);
  backend_->Synchronize();  // the parameters' upload, when no batch was scored
  return Score{loss_sum / std::max<int64_t>(scored, 1),
               static_cast<double>(correct_sum) / std::max<int64_t>(scored, 1), scored};
}

}  // namespace ps
