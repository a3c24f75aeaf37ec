// A check shared by the tests of a tensor path (shared memory, the data plane) against gRPC's
// streams: two workers of one flat model, one on the path and one not, take SGD steps in turn.
#pragma once

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "client/sharded_client.h"

namespace ps {

// `first` and `second` take four steps in turn (first, second, first, second), each a pull that
// must see exactly the weights plain SGD at rate `lr` gives from `initial`, then a push of
// `gradient`; then `first` pulls the result, which goes to `*final_weights` if given. Fails the
// calling test at the first difference.
inline void ExpectStepsInTurnAgree(ShardedClient& first, ShardedClient& second,
                                   std::vector<float> initial, const std::vector<float>& gradient,
                                   float lr, std::vector<float>* final_weights = nullptr) {
  std::vector<float> expected = std::move(initial), got(expected.size());
  for (int step = 0; step < 4; ++step) {
    ShardedClient& client = step % 2 == 0 ? first : second;
    absl::StatusOr<ShardedClient::Versions> seen = client.Pull(absl::MakeSpan(got));
    ASSERT_TRUE(seen.ok()) << seen.status();
    ASSERT_EQ(got, expected) << "step " << step;
    ASSERT_TRUE(client.Push(gradient).ok());
    for (size_t i = 0; i < expected.size(); ++i) expected[i] -= lr * gradient[i];
  }
  ASSERT_TRUE(first.Pull(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, expected);
  if (final_weights != nullptr) *final_weights = std::move(got);
}

}  // namespace ps
