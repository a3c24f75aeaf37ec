// How many CPUs this process may run on: its affinity mask (a container's or taskset's limit),
// 1 if it cannot tell. For defaults that scale with the host (apply threads, data-plane lanes).
#pragma once

#include <sched.h>

namespace ps {

inline int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

}  // namespace ps
