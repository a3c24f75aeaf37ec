// What a party believes the model is. Shards refuse clients whose identity differs from theirs,
// so a worker started with the wrong --hidden sizes or shard list fails at once with a reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ps {

struct ModelIdentity {
  std::string fingerprint;  // e.g. "mlp:784-256-128-10"
  int64_t total_params = 0;
  int num_shards = 0;
  // The last values of the flat vector that are a layout's buffers: held, not trained.
  int64_t buffer_values = 0;
  // A tensor layout's canonical JSON (TensorLayout::ToJson), with which a refusal can name the
  // first tensor that differs; "" for other models. Never compared: the fingerprint hashes it.
  // (Its default initializer lets {fingerprint, N, S} leave it out without a warning.)
  std::string layout{};
};

// The largest `layout` a client sends at registration (about a thousand tensors) and a shard
// reads there: a larger one's refusal names the fingerprints only.
inline constexpr size_t kMaxLayoutSent = 64 * 1024;

}  // namespace ps
