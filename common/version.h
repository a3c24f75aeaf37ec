// What this build is: the release (CMake's project(VERSION)), the git commit it was built from,
// its build type and whether the CUDA backend is built; and the wire version, which a client and a
// shard (or two shard processes) compare at first contact, refusing each other when they differ.
// Everything here is constant for the process and safe to call from any thread.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps {

// The protocol (proto/ps.proto, transport/data_frames.h) this release speaks. Raise it with any
// change that an older peer would misread; a peer of another wire version is refused.
inline constexpr int kWireVersion = 1;

struct BuildInfo {
  const char* version;     // "1.3.0": project(VERSION)
  const char* commit;      // git short commit of the checkout built, or "unknown"
  const char* build_type;  // CMAKE_BUILD_TYPE: "Release", "Debug", ...
  bool cuda;               // the CUDA backend is built
};
// Generated at build time (cmake/write_version.cmake).
const BuildInfo& Build();

// "paramserver 1.3.0 (3a22abf, Release, CUDA on)": every program's --version.
std::string VersionLine();

// OK when the peer speaks kWireVersion. Otherwise FAILED_PRECONDITION naming both sides, e.g.
// "client speaks wire version 2 (paramserver 1.4.0), this shard wire version 1 (paramserver
// 1.3.0): run the same release on both sides". `peer_wire_version` 0 is a peer that sent none (an
// older release, before wire versions). `peer` and `self` name the two sides ("client", "shard").
absl::Status CheckWireVersion(int peer_wire_version, absl::string_view peer_release,
                              absl::string_view peer, absl::string_view self);

// Sets a message's wire_version and release fields (proto/ps.proto) to this process's.
template <typename Message>
void StampRelease(Message* message) {
  message->set_wire_version(kWireVersion);
  message->set_release(Build().version);
}

// CheckWireVersion of the wire_version and release fields `message` carries from `peer`.
template <typename Message>
absl::Status CheckRelease(const Message& message, absl::string_view peer, absl::string_view self) {
  return CheckWireVersion(message.wire_version(), message.release(), peer, self);
}

}  // namespace ps
