// What a party believes the model is. Shards refuse clients whose identity differs from theirs,
// so a worker started with the wrong --hidden sizes or shard list fails at once with a reason.
#pragma once

#include <cstdint>
#include <string>

namespace ps {

struct ModelIdentity {
  std::string fingerprint;  // e.g. "mlp:784-256-128-10"
  int64_t total_params = 0;
  int num_shards = 0;
  // The last values of the flat vector that are a layout's buffers: held, not trained.
  int64_t buffer_values = 0;
};

}  // namespace ps
