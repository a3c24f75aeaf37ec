// netdelay: the latency half of `tc netem`, for kernels built without sch_netem. Holds every packet
// of one NFQUEUE queue for a delay (fixed, plus uniform jitter) and then accepts it, in arrival
// order (a packet never overtakes an earlier one, so jitter does not reorder a TCP stream). Runs in
// a network namespace beside a rule that queues the packets to delay, e.g.
//   iptables -A INPUT -i h0 -j NFQUEUE --queue-num 0 --queue-bypass
// (with --queue-bypass packets pass undelayed while no netdelay is bound). Delaying on the
// receiving host's INPUT, not on the sender's egress, keeps the held packets out of the sender's
// TCP small- queue accounting (which would otherwise cap a delayed flow's window). Packets beyond
// --max_held are dropped by the kernel, like netem's limit. SIGTERM: accepts what it holds and
// exits 0.
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sys/socket.h>

extern "C" {
#include <libnetfilter_queue/libnetfilter_queue.h>
}

#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/shutdown.h"

ABSL_FLAG(int, queue, 0, "NFQUEUE queue number to take packets from.");
ABSL_FLAG(double, delay_ms, 2, "Delay of every packet, in milliseconds.");
ABSL_FLAG(double, jitter_ms, 0, "Plus a uniform random delay in [-jitter, +jitter] ms.");
ABSL_FLAG(uint32_t, max_held, 65536, "Packets held at once; the kernel drops those beyond.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the jitter.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("netdelay", reason); }

// The packets held, oldest first, each with the time it is due.
struct Held {
  uint32_t id;
  absl::Time due;
};

struct Delayer {
  absl::Duration delay, jitter;
  absl::BitGen random;
  std::deque<Held> held;
  absl::Time last_due = absl::InfinitePast();
  int64_t delayed = 0;

  static int OnPacket(nfq_q_handle*, nfgenmsg*, nfq_data* packet, void* self) {
    static_cast<Delayer*>(self)->Hold(ntohl(nfq_get_msg_packet_hdr(packet)->packet_id));
    return 0;
  }
  void Hold(uint32_t id) {
    absl::Duration d = delay;
    if (jitter > absl::ZeroDuration()) {
      d += absl::Microseconds(absl::Uniform<double>(random, -1, 1) *
                              absl::ToDoubleMicroseconds(jitter));
    }
    last_due = std::max(last_due, absl::Now() + std::max(d, absl::ZeroDuration()));
    held.push_back({id, last_due});
  }
  // Accepts every packet due by now, with one batch verdict (ids grow with arrival, and so does
  // the due time).
  absl::Status Release(nfq_q_handle* queue) {
    const absl::Time now = absl::Now();
    std::optional<uint32_t> last;
    while (!held.empty() && held.front().due <= now) {
      last = held.front().id;
      held.pop_front();
      ++delayed;
    }
    if (last && nfq_set_verdict_batch(queue, *last, NF_ACCEPT) < 0) {
      return absl::InternalError(absl::StrCat("verdict failed: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  absl::Status ReleaseAll(nfq_q_handle* queue) {
    for (Held& h : held) h.due = absl::InfinitePast();
    return Release(queue);
  }
};

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Delays the packets of an NFQUEUE queue (netem's delay without netem).\n"
      "  netdelay --queue=0 --delay_ms=2 --jitter_ms=1");
  absl::ParseCommandLine(argc, argv);
  SetLogTag("netdelay");
  InstallShutdownHandler();
  Delayer delayer;
  delayer.delay = absl::Microseconds(absl::GetFlag(FLAGS_delay_ms) * 1000);
  delayer.jitter = absl::Microseconds(absl::GetFlag(FLAGS_jitter_ms) * 1000);
  delayer.random = absl::BitGen(std::seed_seq{absl::GetFlag(FLAGS_seed)});
  if (delayer.delay < absl::ZeroDuration() || delayer.jitter < absl::ZeroDuration()) {
    return Fail("--delay_ms and --jitter_ms must not be negative");
  }
  const int queue_number = absl::GetFlag(FLAGS_queue);
  if (queue_number < 0 || queue_number > 65535) return Fail("--queue must be in [0, 65535]");

  nfq_handle* handle = nfq_open();
  if (handle == nullptr) {
    return Fail(absl::StrCat("cannot open netfilter queue netlink: ", std::strerror(errno),
                             " (needs CAP_NET_ADMIN and a kernel with NETFILTER_NETLINK_QUEUE)"));
  }
  nfq_q_handle* queue = nfq_create_queue(handle, queue_number, &Delayer::OnPacket, &delayer);
  if (queue == nullptr) {
    nfq_close(handle);
    return Fail(absl::StrCat("cannot bind queue ", queue_number, ": ", std::strerror(errno)));
  }
  // Only the packet ids come up (no payload); GSO packets come whole, not segmented for us.
  if (nfq_set_mode(queue, NFQNL_COPY_META, 0) < 0 ||
      nfq_set_queue_maxlen(queue, absl::GetFlag(FLAGS_max_held)) < 0 ||
      nfq_set_queue_flags(queue, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0) {
    nfq_destroy_queue(queue);
    nfq_close(handle);
    return Fail(absl::StrCat("cannot configure queue ", queue_number, ": ", std::strerror(errno)));
  }
  nfnl_rcvbufsiz(nfq_nfnlh(handle), 16 << 20);
  PS_LOG(INFO) << "queue " << queue_number << ": delaying packets " << absl::GetFlag(FLAGS_delay_ms)
               << " ms +- " << absl::GetFlag(FLAGS_jitter_ms) << " ms";

  const int fd = nfq_fd(handle);
  std::vector<char> buffer(1 << 16);
  int64_t lost_notifications = 0;
  absl::Status status;
  while (status.ok() && !ShutdownRequested()) {
    // Sleep until the next packet is due (at most 50 ms, to notice a shutdown).
    absl::Duration wait = absl::Milliseconds(50);
    if (!delayer.held.empty()) wait = std::min(wait, delayer.held.front().due - absl::Now());
    const timespec timeout = absl::ToTimespec(std::max(wait, absl::ZeroDuration()));
    pollfd p{fd, POLLIN, 0};
    if (ppoll(&p, 1, &timeout, nullptr) > 0) {
      for (;;) {
        const ssize_t n = recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
        if (n > 0) {
          nfq_handle_packet(handle, buffer.data(), static_cast<int>(n));
        } else if (n < 0 && errno == ENOBUFS) {
          ++lost_notifications;  // the kernel dropped the packets it could not tell us about
        } else {
          break;
        }
      }
    }
    status = delayer.Release(queue);
  }
  if (status.ok()) status = delayer.ReleaseAll(queue);
  PS_LOG(INFO) << "delayed " << delayer.delayed << " packets; " << lost_notifications
               << " overflow(s) of the notification buffer";
  nfq_destroy_queue(queue);
  nfq_close(handle);
  if (!status.ok()) return Fail(std::string(status.message()));
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
