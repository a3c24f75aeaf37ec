// The bulk data plane for a client on the same host as a shard: tensor bytes go through memory
// both processes map, while the request and its answer (header, version, status) still travel
// over the authenticated gRPC call. gRPC on loopback copies every byte several times through the
// kernel and both processes' buffers; here a push costs two copies (the client's into the
// segment, the shard's out of it into its own buffer) and a pull two (the shard's values into the
// segment under its shared lock, the client's out of it).
//
// A segment is created by the shard (a memfd sealed against shrinking and growing, so that a
// buggy client cannot cut it short under the shard) and opened by the client through
// /proc/<shard pid>/fd/<fd>, which the kernel allows only to processes of the shard's user (or
// root) that see its PID namespace: processes that could signal the shard anyway, so sharing
// memory with them gives away nothing the socket kept. A random nonce at its start proves the
// client opened the segment the shard meant. The shard never trusts what a segment holds: it
// copies a push out before checking it (so the client cannot change the bytes between the check
// and the update), and it never waits on a segment.
//
// Each segment has two regions, one per direction, each with a state word that says whose turn it
// is (see SharedRegion). Thread-safety: a SharedSegment is immutable after creation; its regions
// are used by one call at a time on each side.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps {

// Where this process lives: the running kernel's boot id (/proc/sys/kernel/random/boot_id) and
// its PID namespace (/proc/self/ns/pid). Processes that report the same one run on the same host
// and see each other's /proc entries. Empty if unreadable.
const std::string& ProcessSpaceId();

// One direction's buffer in a segment and whose turn it is. The state is (phase, ticket): the
// ticket names the request (carried by the gRPC call) that the bytes belong to.
//   push (client -> shard): client Claim(kBusy, t), writes, Move(kBusy, kReady, t), calls;
//                           shard Move(kReady, kBusy, t) or refuses, reads, Move(kBusy, kIdle, t).
//   pull (shard -> client): client Claim(kReady, t), calls; shard Move(kReady, kBusy, t) or
//                           refuses, writes, Move(kBusy, kFilled, t), answers; client
//                           Move(kFilled, kBusy, t) or fails, reads, Move(kBusy, kIdle, t).
// A call abandoned by the client (a deadline) leaves a state the next Claim overwrites, and its
// late server side then finds the ticket changed and refuses: bytes of two requests never mix.
class SharedRegion {
 public:
  enum Phase : uint64_t { kIdle = 0, kBusy = 1, kReady = 2, kFilled = 3 };

  SharedRegion(std::atomic<uint64_t>* state, char* data, int64_t capacity)
      : state_(state), data_(data), capacity_(capacity) {}

  // Waits (polling, until `deadline`) while one side is busy with the region, then sets
  // (phase, ticket). False if it stayed busy: the peer is stuck or gone.
  bool Claim(Phase phase, uint64_t ticket, absl::Time deadline);
  // Sets (to, ticket) if the state is (from, ticket); false (nothing changed) otherwise.
  bool Move(Phase from, Phase to, uint64_t ticket);
  // Gives the region's memory back to the system if it is idle (holding it busy meanwhile, so a
  // Claim waits); its bytes read as zeros after, and the next write takes pages again. False if
  // it was not idle.
  bool DiscardIfIdle();

  char* data() const { return data_; }
  int64_t capacity() const { return capacity_; }

 private:
  std::atomic<uint64_t>* state_;
  char* data_;
  int64_t capacity_;
};

class SharedSegment {
 public:
  // Shard side: a new sealed segment with two regions of `region_bytes` each and a fresh nonce.
  static absl::StatusOr<SharedSegment> Create(int64_t region_bytes);
  // Client side: maps the segment process `pid` holds as descriptor `fd`, checking that it has
  // regions of `region_bytes` and starts with `nonce`. Fails (naming why) where the process is
  // not visible or not ours to read (another host, PID namespace or user), or is not the segment.
  static absl::StatusOr<SharedSegment> Open(int pid, int fd, const std::string& nonce,
                                            int64_t region_bytes);

  SharedSegment(SharedSegment&& o) noexcept;
  SharedSegment& operator=(SharedSegment&& o) = delete;
  SharedSegment(const SharedSegment&) = delete;
  ~SharedSegment();

  int fd() const { return fd_; }
  const std::string& nonce() const { return nonce_; }
  int64_t region_bytes() const { return region_bytes_; }
  // The client's gradients to the shard, and the shard's weights to the client.
  SharedRegion push() const;
  SharedRegion pull() const;

  static constexpr int kNonceBytes = 16;

 private:
  SharedSegment(int fd, char* base, int64_t mapped, int64_t region_bytes, std::string nonce)
      : fd_(fd), base_(base), mapped_(mapped), region_bytes_(region_bytes), nonce_(nonce) {}

  int fd_;
  char* base_;
  int64_t mapped_;
  int64_t region_bytes_;
  std::string nonce_;
};

}  // namespace ps
