#include "common/network_spec.h"

#include <algorithm>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model_spec.h"

namespace ps {
namespace {

constexpr int64_t kMaxParams = int64_t{1} << 40;
constexpr int64_t kMaxWidth = std::numeric_limits<int>::max();

absl::Status Bad(const std::string& spec, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad model spec '", spec, "': ", why,
                   " (expected mlp:IN-H1-...-OUT or cnn:CxHxW-conv32k5-pool2-...-fc128-OUT, see "
                   "common/network_spec.h)"));
}

bool ParsePositive(absl::string_view text, int* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < 1 || v > kMaxWidth) return false;
  *out = static_cast<int>(v);
  return true;
}

// "32k5s2p1" after "conv": the channels, then optional k, s, p fields in that order.
bool ParseConv(absl::string_view text, LayerSpec* layer) {
  size_t i = 0;
  auto number = [&](int* out) {
    size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > start && ParsePositive(text.substr(start, i - start), out);
  };
  if (!number(&layer->size)) return false;
  layer->kernel = 3;
  bool pad_given = false;
  for (char field : {'k', 's', 'p'}) {
    if (i < text.size() && text[i] == field) {
      ++i;
      int* target = field == 'k' ? &layer->kernel : field == 's' ? &layer->stride : &layer->pad;
      if (field == 'p' && i < text.size() && text[i] == '0') {  // p0: no padding
        ++i;
        layer->pad = 0;
        pad_given = true;
        continue;
      }
      if (!number(target)) return false;
      pad_given |= field == 'p';
    }
  }
  if (!pad_given) layer->pad = layer->kernel / 2;
  return i == text.size();
}

// Parses a spec's layers in order, tracking the shape each one sees and the parameters so far.
class LayerParser {
 public:
  explicit LayerParser(const std::string& spec) : spec_(spec) {}

  // The words of the layers after the input ("fc" put before an mlp's sizes and a cnn's
  // classes); sets net->convolutional and the input's shape. Fails naming a bad input.
  absl::StatusOr<std::vector<std::string>> SplitInput(NetworkSpec* net) {
    std::vector<std::string> parts;
    if (absl::StartsWith(spec_, "mlp:")) {
      parts = absl::StrSplit(spec_.substr(4), '-');
      if (parts.size() < 2) return Bad(spec_, "an mlp needs at least inputs and outputs");
      if (!ParsePositive(parts[0], &channels_)) {
        return Bad(spec_, absl::StrCat("inputs '", parts[0], "' is not a positive number"));
      }
      for (size_t i = 1; i < parts.size(); ++i) parts[i] = "fc" + parts[i];
    } else if (absl::StartsWith(spec_, "cnn:")) {
      net->convolutional = true;
      parts = absl::StrSplit(spec_.substr(4), '-');
      std::vector<std::string> input = absl::StrSplit(parts[0], 'x');
      if (input.size() != 3 || !ParsePositive(input[0], &channels_) ||
          !ParsePositive(input[1], &height_) || !ParsePositive(input[2], &width_)) {
        return Bad(spec_, absl::StrCat("input '", parts[0], "' is not CxHxW"));
      }
      if (parts.size() < 2) return Bad(spec_, "no classes");
      parts.back() = "fc" + parts.back();
    } else {
      return Bad(spec_, "not a network");
    }
    parts.erase(parts.begin());
    return parts;
  }

  // The layer `word` ("conv32k5", "pool2", "fc128") on the current shape, which becomes its
  // output; `last`: the classes' layer. Fails naming the word.
  absl::StatusOr<LayerSpec> Next(const std::string& word, bool last) {
    absl::string_view text = word;
    LayerSpec l;
    l.in_height = height_;
    l.in_width = width_;
    l.in_channels = channels_;
    absl::Status parsed;
    if (absl::ConsumePrefix(&text, "conv")) {
      parsed = Conv(word, text, &l);
    } else if (absl::ConsumePrefix(&text, "pool")) {
      parsed = Pool(word, text, &l);
    } else if (absl::ConsumePrefix(&text, "fc")) {
      parsed = Dense(word, text, last, &l);
    } else {
      parsed = Bad(spec_, absl::StrCat("unknown layer '", word, "'"));
    }
    if (!parsed.ok()) return parsed;
    l.out_height = height_;
    l.out_width = width_;
    l.out_channels = channels_;
    if (l.out_size() > kMaxWidth || l.in_size() > kMaxWidth) {
      return Bad(spec_, absl::StrCat("layer '", word, "' is wider than 2^31 - 1"));
    }
    // Each factor is < 2^31, so products fit in 128 bits; compare before narrowing.
    const __int128 weights =
        l.kind == LayerSpec::Kind::kConv
            ? static_cast<__int128>(l.kernel) * l.kernel * l.in_channels * l.size
            : static_cast<__int128>(l.in_size()) * l.size;
    if (weights + total_ > kMaxParams) return Bad(spec_, "more than 2^40 parameters");
    total_ += l.num_weights();
    return l;
  }

 private:
  absl::Status Conv(const std::string& word, absl::string_view text, LayerSpec* l) {
    l->kind = LayerSpec::Kind::kConv;
    if (dense_seen_ || !ParseConv(text, l)) {
      return Bad(spec_, absl::StrCat("layer '", word, "' is not convO[kK][sS][pP]",
                                     dense_seen_ ? " before the dense layers" : ""));
    }
    l->relu = true;
    if (l->pad >= l->kernel) {
      return Bad(spec_, absl::StrCat("layer '", word, "': padding must be below the kernel"));
    }
    if (int64_t{height_} + 2 * l->pad < l->kernel || int64_t{width_} + 2 * l->pad < l->kernel) {
      return Bad(spec_, absl::StrCat("layer '", word, "': kernel larger than its input ", height_,
                                     "x", width_));
    }
    if (int64_t{l->kernel} * l->kernel * channels_ > kMaxWidth) {
      return Bad(spec_, absl::StrCat("layer '", word, "' is wider than 2^31 - 1"));
    }
    height_ = static_cast<int>((int64_t{height_} + 2 * l->pad - l->kernel) / l->stride + 1);
    width_ = static_cast<int>((int64_t{width_} + 2 * l->pad - l->kernel) / l->stride + 1);
    channels_ = l->size;
    return absl::OkStatus();
  }

  absl::Status Pool(const std::string& word, absl::string_view text, LayerSpec* l) {
    l->kind = LayerSpec::Kind::kPool;
    if (dense_seen_ || !ParsePositive(text, &l->size)) {
      return Bad(spec_, absl::StrCat("layer '", word, "' is not poolN",
                                     dense_seen_ ? " before the dense layers" : ""));
    }
    if (l->size > height_ || l->size > width_) {
      return Bad(spec_, absl::StrCat("layer '", word, "': window larger than its input ", height_,
                                     "x", width_));
    }
    height_ /= l->size;
    width_ /= l->size;
    return absl::OkStatus();
  }

  absl::Status Dense(const std::string& word, absl::string_view text, bool last, LayerSpec* l) {
    l->kind = LayerSpec::Kind::kDense;
    if (!ParsePositive(text, &l->size)) {
      return Bad(spec_, absl::StrCat("size '", word, "' is not a positive number"));
    }
    dense_seen_ = true;
    l->relu = !last;
    height_ = width_ = 1;
    channels_ = l->size;
    return absl::OkStatus();
  }

  const std::string& spec_;
  int height_ = 1, width_ = 1, channels_ = 0;  // the input of the next layer
  bool dense_seen_ = false;                    // no conv or pool after a dense layer
  int64_t total_ = 0;                          // parameters so far
};

}  // namespace

int64_t LayerSpec::num_weights() const {
  switch (kind) {
    case Kind::kConv:
      return int64_t{kernel} * kernel * in_channels * size + size;
    case Kind::kDense:
      return in_size() * size + size;
    case Kind::kPool:
      return 0;
  }
  return 0;
}

int64_t NetworkSpec::num_params() const {
  int64_t n = 0;
  for (const LayerSpec& l : layers) n += l.num_weights();
  return n;
}

absl::Status NetworkSpec::FitsBatch(int batch) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    int64_t widest = std::max(l.in_size(), l.out_size());
    if (l.kind == LayerSpec::Kind::kConv) {
      widest = std::max(widest,
                        int64_t{l.out_height} * l.out_width * l.kernel * l.kernel * l.in_channels);
    }
    if (static_cast<__int128>(widest) * batch > kMaxWidth) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", i + 1, " of ", ToString(),
                                                     " is too large for batches of ", batch,
                                                     " (more than 2^31 - 1 values)"));
    }
  }
  return absl::OkStatus();
}

absl::Status NetworkSpec::FitsFashionMnist() const {
  const LayerSpec& first = layers.front();
  const bool inputs = convolutional
                          ? first.in_channels == 1 && first.in_height == 28 && first.in_width == 28
                          : first.in_size() == 784;
  if (!inputs || classes() != 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", ToString(), " does not fit Fashion-MNIST: it needs ",
                     convolutional ? "a 1x28x28 input" : "784 inputs", " and 10 classes"));
  }
  return absl::OkStatus();
}

std::string NetworkSpec::ToString() const {
  const LayerSpec& first = layers.front();
  std::vector<std::string> parts;
  if (!convolutional) {
    parts.push_back(absl::StrCat(first.in_size()));
    for (const LayerSpec& l : layers) parts.push_back(absl::StrCat(l.size));
    return "mlp:" + absl::StrJoin(parts, "-");
  }
  parts.push_back(absl::StrCat(first.in_channels, "x", first.in_height, "x", first.in_width));
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    if (l.kind == LayerSpec::Kind::kConv) {
      std::string conv = absl::StrCat("conv", l.size, "k", l.kernel);
      if (l.stride != 1) absl::StrAppend(&conv, "s", l.stride);
      if (l.pad != l.kernel / 2) absl::StrAppend(&conv, "p", l.pad);
      parts.push_back(conv);
    } else if (l.kind == LayerSpec::Kind::kPool) {
      parts.push_back(absl::StrCat("pool", l.size));
    } else {
      parts.push_back(i + 1 < layers.size() ? absl::StrCat("fc", l.size) : absl::StrCat(l.size));
    }
  }
  return "cnn:" + absl::StrJoin(parts, "-");
}

absl::StatusOr<NetworkSpec> ParseNetworkSpec(const std::string& spec) {
  NetworkSpec net;
  LayerParser parser(spec);
  absl::StatusOr<std::vector<std::string>> layers = parser.SplitInput(&net);
  if (!layers.ok()) return layers.status();
  for (size_t i = 0; i < layers->size(); ++i) {
    absl::StatusOr<LayerSpec> layer = parser.Next((*layers)[i], i + 1 == layers->size());
    if (!layer.ok()) return layer.status();
    net.layers.push_back(*layer);
  }
  return net;
}

absl::StatusOr<NetworkSpec> ResolveModel(const std::string& model, const std::string& hidden) {
  if (model.empty()) {
    absl::StatusOr<std::vector<int>> sizes = MlpLayerSizes(784, hidden, 10);
    if (!sizes.ok()) return sizes.status();
    return MlpNetwork(*sizes);
  }
  if (model == "cnn-small") {
    return ParseNetworkSpec("cnn:1x28x28-conv16k5-pool2-conv32k5-pool2-fc128-10");
  }
  if (model == "cnn-large") {
    return ParseNetworkSpec("cnn:1x28x28-conv32k3-conv32k3-pool2-conv64k3-conv64k3-pool2-fc256-10");
  }
  return ParseNetworkSpec(model);
}

NetworkSpec MlpNetwork(const std::vector<int>& sizes) {
  NetworkSpec net;
  for (size_t i = 1; i < sizes.size(); ++i) {
    LayerSpec l;
    l.size = sizes[i];
    l.relu = i + 1 < sizes.size();
    l.in_channels = sizes[i - 1];
    l.out_channels = sizes[i];
    net.layers.push_back(l);
  }
  return net;
}

std::vector<TensorSlot> TensorSlots(const NetworkSpec& spec) {
  std::vector<TensorSlot> slots;
  int64_t offset = 0;
  int convs = 0, denses = 0;
  for (const LayerSpec& l : spec.layers) {
    if (l.kind == LayerSpec::Kind::kPool) continue;
    std::string prefix;
    std::vector<int64_t> shape;
    if (l.kind == LayerSpec::Kind::kConv) {
      prefix = absl::StrCat("conv", ++convs);
      shape = {l.kernel, l.kernel, l.in_channels, l.size};
    } else {
      prefix = absl::StrCat("fc", ++denses);
      shape = {l.in_size(), l.size};
    }
    const int64_t weights = l.num_weights() - l.size;
    slots.push_back({prefix + ".weight", shape, offset, weights});
    offset += weights;
    slots.push_back({prefix + ".bias", {l.size}, offset, l.size});
    offset += l.size;
  }
  return slots;
}

}  // namespace ps
