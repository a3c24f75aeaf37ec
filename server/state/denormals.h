// ScopedFlushDenormals: while alive, the calling thread's SSE arithmetic reads denormal floats as
// zero (DAZ) and writes zero instead of a denormal result (FTZ); the previous mode comes back at
// the end of the scope. Optimizer state decaying towards zero (momentum, Adam's moments, over many
// steps without gradient) passes through the denormal range, where each operation costs on the
// order of 100 cycles on many Intel processors: a shard's updates then slow down several times.
// Flushing changes only values below 1.2e-38. A no-op without SSE.
#pragma once

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace ps {

class ScopedFlushDenormals {
 public:
#if defined(__SSE__)
  ScopedFlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~ScopedFlushDenormals() { _mm_setcsr(saved_); }
#else
  ScopedFlushDenormals() = default;
#endif
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
#if defined(__SSE__)
  static constexpr unsigned kFtz = 0x8000;  // MXCSR flush-to-zero
  static constexpr unsigned kDaz = 0x0040;  // MXCSR denormals-are-zero
  unsigned saved_;
#endif
};

}  // namespace ps
