// Server-side optimizers: one small class per algorithm, each owning its per-element state for the
// shard's range. Not thread-safe; ParameterShard serialises calls (an Apply may use several
// threads of its own).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/state/apply_threads.h"

namespace ps {

// Hyper-parameters other than the learning rate, which comes from a LearningRateSchedule.
struct OptimizerConfig {
  std::string name = "sgd";  // sgd | momentum | nesterov | adam | adagrad
  float momentum = 0.9f;     // momentum, nesterov
  float beta1 = 0.9f;        // adam
  float beta2 = 0.999f;      // adam
  float epsilon = 1e-8f;     // adam, adagrad
};

// What one pass over a gradient finds (ScanGradient).
struct GradientSummary {
  int64_t first_nonfinite = -1;  // index of the first NaN or infinity; -1: none
  float max_abs = 0;             // max |g[i]|; infinity when some value is not finite
  double sum_of_squares = 0;     // when asked for, and every value is finite
};
// One pass over `g`, in parallel on `threads` (null: the calling thread); the sum of squares
// (for clipping) only if `squares`.
GradientSummary ScanGradient(absl::Span<const float> g, ApplyThreads* threads = nullptr,
                             bool squares = false);

// ScanGradient on one thread over a gradient that arrives in runs of values, each told as soon as
// it is in place (while in the cache, and while the rest is on its way). The sums go by blocks
// of kBlock values (in 16 lanes each), combined in block order at Finish: the same summary, bit
// for bit, whatever the runs' lengths and the order the blocks come in (ScanGradient on one
// thread is one such scan). Runs of different blocks may be added from different threads at
// once; one block's values come in order, from one thread at a time.
class GradientScan {
 public:
  static constexpr int64_t kBlock = int64_t{1} << 16;
  // A scan of `g`'s values, which must stay in place until Finish.
  GradientScan(absl::Span<const float> g, bool squares);
  // A run of g's values (a part of `g`), now in place.
  void Add(absl::Span<const float> run);
  // Values added so far (not while runs are being added).
  int64_t count() const;
  // The summary of the values added, which must be all of g.
  GradientSummary Finish() const;

 private:
  static constexpr int kLanes = 16;
  struct Block {
    int64_t count = 0;
    float max_abs = 0;
    double lane[kLanes] = {};  // squares of the values at index i % kLanes, whole groups only
    float carry[kLanes] = {};  // the values of a group not yet whole
    int carried = 0;
  };
  void AddToBlock(Block& block, const float* p, int64_t n) const;

  absl::Span<const float> g_;
  bool squares_;
  std::vector<Block> blocks_;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string Name() const = 0;

  // Updates weights[i] with grad[i] for the optimizer's whole range (weights.size() must be the
  // size it was made for), in parallel on `threads` (null: the calling thread). `step` counts
  // updates applied before this one. All or nothing: if the update would make any weight or state
  // value non-finite (a finite but huge gradient can), fails with INVALID_ARGUMENT naming the
  // first such element and changes nothing.
  // Speed: the check is a dry run of the update, a second pass over every array. It is skipped
  // when bounds prove every new value finite: `max_abs_grad` (an upper bound on |grad[i]|, e.g.
  // ScanGradient's; infinity: none) and the largest magnitudes of the weights and state that the
  // previous update left (which is why the weights must be changed by nothing but Apply between
  // two calls, or the optimizer made anew). Either way the values written are the same.
  absl::Status Apply(absl::Span<float> weights, absl::Span<const float> grad, float learning_rate,
                     int64_t step, ApplyThreads* threads = nullptr,
                     float max_abs_grad = std::numeric_limits<float>::infinity());

  // The per-element state by slot name ("momentum", "adam_m", ...), as views of the optimizer's
  // own buffers (one value per element of the shard): checkpoints read them.
  std::vector<std::pair<std::string, absl::Span<const float>>> State() const;
  // The same to write into (restoring a checkpoint): forgets the magnitudes Apply relies on.
  std::vector<std::pair<std::string, absl::Span<float>>> MutableState();

  // Upper bounds on |value| for the weights and up to two state slots; infinity: unknown.
  struct Magnitudes {
    double weights = std::numeric_limits<double>::infinity();
    double state[2] = {std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::infinity()};
  };

 protected:
  explicit Optimizer(int64_t size) : size_(size) {}
  virtual std::vector<std::pair<std::string, absl::Span<float>>> Slots() = 0;
  // The update with kCommit = false computes without writing and returns the index of the first
  // element whose new weight or state would be non-finite (-1: none); with kCommit = true it
  // writes, and returns the new values' magnitudes. Both passes run the same arithmetic, so the
  // check is exact. The elements sit at `offset` within the optimizer's range.
  virtual int64_t FirstNonFinite(absl::Span<const float> w, absl::Span<const float> g,
                                 int64_t offset, float lr, int64_t step) = 0;
  virtual Magnitudes Commit(absl::Span<float> w, absl::Span<const float> g, int64_t offset,
                            float lr, int64_t step) = 0;
  // An upper bound on the magnitude of every value (new weights, new state, intermediate results)
  // of an update with gradients of magnitude <= max_g, given the magnitudes before it.
  virtual double Bound(float lr, int64_t step, double max_g, const Magnitudes& before) const = 0;

 private:
  const int64_t size_;
  Magnitudes magnitudes_;  // as the last Apply left them
};

// Creates the optimizer named in `config` for `size` elements, or fails naming the unknown
// optimizer or the bad hyper-parameter.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         int64_t size);

}  // namespace ps
