#include "common/version.h"

#include "absl/strings/str_cat.h"

namespace ps {

std::string VersionLine() {
  const BuildInfo& b = Build();
  return absl::StrCat("paramserver ", b.version, " (", b.commit, ", ", b.build_type, ", CUDA ",
                      b.cuda ? "on" : "off", ")");
}

absl::Status CheckWireVersion(int peer_wire_version, absl::string_view peer_release,
                              absl::string_view peer, absl::string_view self) {
  if (peer_wire_version == kWireVersion) return absl::OkStatus();
  const std::string theirs =
      peer_wire_version == 0
          ? absl::StrCat(peer, " sends no wire version (an older paramserver release)")
          : absl::StrCat(peer, " speaks wire version ", peer_wire_version, " (paramserver ",
                         peer_release.empty() ? "?" : peer_release, ")");
  return absl::FailedPreconditionError(absl::StrCat(theirs, ", this ", self, " wire version ",
                                                    kWireVersion, " (paramserver ", Build().version,
                                                    "): run the same release on both sides"));
}

}  // namespace ps
