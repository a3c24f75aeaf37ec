#include "server/rpc/data_plane.h"

#include <atomic>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/data_frames.h"
#include "common/frame_inbox.h"
#include "common/log.h"

namespace ps {

// One client's connection: the socket, the Push calls waiting for their tensors (its inbox,
// read by Serve's thread) and the Pull answers waiting to be sent (by SendLoop's thread). Lock
// order: DataPlane::mu_, then mu.
class DataPlane::Connection {
 public:
  Connection(Socket s, uint64_t max_frame_bytes)
      : socket(std::move(s)), inbox(&socket, FrameKind::kPush, max_frame_bytes) {}
  // Ends the connection: waits on its socket fail, the threads end, waiting calls wake.
  void Close() {
    inbox.End();
    absl::MutexLock lock(&mu);
    closed = true;
  }

  struct Outgoing {
    uint64_t transfer;
    std::shared_ptr<const void> keep;
    absl::Span<const float> values;
    WireType type = WireType::kFloat32;
    Sent sent;
    const FillProgress* filling = nullptr;  // alive until `sent` (DataPlane::Send)
  };

  Socket socket;
  FrameInbox inbox;
  // Written before the connection is open (under DataPlane::mu_), read-only afterwards.
  uint64_t id = 0;
  int owner = 0;
  std::thread reader, sender;      // sender: started by the reader once admitted
  std::atomic<bool> ended{false};  // the reader is done: the threads may be joined

  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  std::deque<Outgoing> outgoing ABSL_GUARDED_BY(mu);
};

namespace {
// Pull answers queued on one connection at most (a worker has at most a few pulls in flight).
constexpr size_t kMaxOutgoing = 16;
// Connections accepted and still saying hello, beyond max_connections.
constexpr int kAdmittingSlack = 8;

// Compares secrets in time that does not depend on where they differ.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

absl::Status Lost(absl::string_view why) {
  return absl::FailedPreconditionError(
      absl::StrCat("data plane: ", why, "; the tensor goes over gRPC"));
}
}  // namespace

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Start(Options options) {
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Listen(options.host, options.port);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<DataPlane> plane(new DataPlane(std::move(options), *std::move(listener)));
  plane->accepting_ = std::thread([p = plane.get()] { p->AcceptLoop(); });
  return plane;
}

DataPlane::DataPlane(Options options, std::unique_ptr<Listener> listener)
    : options_(std::move(options)), listener_(std::move(listener)) {}

void DataPlane::Stop() {
  listener_->Shutdown();
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  tickets_.clear();
  for (const auto& c : all_) c->Close();
}

DataPlane::~DataPlane() {
  Stop();
  accepting_.join();
  Reap(/*all=*/true);
}

int DataPlane::port() const { return listener_->port(); }

int DataPlane::connections() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(open_.size());
}

absl::StatusOr<DataPlane::Ticket> DataPlane::Issue(int owner) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("the shard is shutting down");
  const absl::Time now = absl::Now();
  for (auto it = tickets_.begin(); it != tickets_.end();) {
    it = it->second.expires < now ? tickets_.erase(it) : std::next(it);
  }
  int taken = static_cast<int>(tickets_.size());
  for (const auto& [id, c] : open_) taken += owner < 0 || c->owner != owner;  // its own is replaced
  if (taken >= options_.max_connections) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the data plane has ", options_.max_connections,
                     " connections and tickets already (ps --data_plane_connections)"));
  }
  Ticket ticket{RandomId(), RandomSecret()};
  tickets_[ticket.connection] = Issued{owner, ticket.secret, now + options_.hello};
  return ticket;
}

void DataPlane::AcceptLoop() {
  for (;;) {
    absl::StatusOr<Socket> s =
        listener_->Accept(absl::Now() + absl::Milliseconds(200), options_.stall);
    Reap(/*all=*/false);
    if (!s.ok()) {
      if (s.status().code() == absl::StatusCode::kCancelled) return;  // shut down
      continue;
    }
    auto c = std::make_shared<Connection>(*std::move(s), options_.max_frame_bytes);
    absl::MutexLock lock(&mu_);
    if (stopped_ || static_cast<int>(all_.size()) >= options_.max_connections + kAdmittingSlack) {
      continue;  // closed at once
    }
    all_.push_back(c);
    c->reader = std::thread([this, c] { Serve(c); });
  }
}

void DataPlane::Reap(bool all) {
  std::vector<std::shared_ptr<Connection>> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = all_.begin(); it != all_.end();) {
      if (all || (*it)->ended.load()) {
        ended.push_back(*it);
        it = all_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& c : ended) {
    c->reader.join();  // the sender is set (or not) before the reader ends
    if (c->sender.joinable()) c->sender.join();
  }
}

absl::Status DataPlane::Admit(const std::shared_ptr<Connection>& connection) {
  Connection& c = *connection;
  const absl::Time deadline = absl::Now() + options_.hello;
  absl::StatusOr<FrameHeader> hello = ReceiveHeader(c.socket, deadline);
  if (!hello.ok()) return hello.status();
  auto refuse = [&](const std::string& why) {
    SendFrame(c.socket, {FrameKind::kRefused}, why, absl::Now() + absl::Seconds(1)).IgnoreError();
    return absl::PermissionDeniedError(why);
  };
  if (hello->kind != FrameKind::kHello || hello->bytes != kSecretBytes) {
    return refuse("the first frame must be a hello with a ticket");
  }
  std::string secret(kSecretBytes, '\0');
  if (absl::Status s = c.socket.Receive(secret.data(), kSecretBytes, deadline); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    auto it = tickets_.find(hello->transfer);
    const bool valid = it != tickets_.end() && it->second.expires >= absl::Now() &&
                       SameSecret(it->second.secret, secret);
    if (!valid) {
      return refuse(
          "unknown, used or expired ticket (ask this shard for one with AttachDataPlane, "
          "authorised with the job's token)");
    }
    c.id = hello->transfer;
    c.owner = it->second.owner;
    tickets_.erase(it);
    if (c.owner >= 0) {  // a worker's newer connection replaces its older one
      for (const auto& [id, other] : open_) {
        if (other->owner == c.owner) other->Close();
      }
    }
    open_[c.id] = connection;
  }
  return SendFrame(c.socket, {FrameKind::kWelcome}, "", deadline);
}

void DataPlane::Serve(std::shared_ptr<Connection> c) {
  absl::Status status = Admit(c);
  if (status.ok()) {
    PS_LOG(INFO) << "data plane: connection of " << (c->owner >= 0 ? "worker " : "observer ")
                 << c->owner << " open";
    c->sender = std::thread([this, c] { SendLoop(*c); });
  }
  if (status.ok()) status = c->inbox.ReadLoop();
  if (c->id != 0) {
    PS_LOG(INFO) << "data plane: connection of " << (c->owner >= 0 ? "worker " : "observer ")
                 << c->owner << " ended (" << status.message() << ")";
  }
  c->Close();
  if (!c->sender.joinable()) {  // registered but never welcomed: fail what was queued meanwhile
    std::deque<Connection::Outgoing> failed;
    {
      absl::MutexLock lock(&c->mu);
      failed.swap(c->outgoing);
    }
    for (auto& f : failed) f.sent(absl::UnavailableError("the data plane connection ended"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (auto it = open_.find(c->id); it != open_.end() && it->second == c) open_.erase(it);
  }
  c->ended.store(true);
}

void DataPlane::SendLoop(Connection& c) {
  for (;;) {
    std::deque<Connection::Outgoing> failed;
    Connection::Outgoing out;
    {
      absl::MutexLock lock(&c.mu);
      auto ready = [&c]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c.mu) {
        return c.closed || !c.outgoing.empty();
      };
      c.mu.Await(absl::Condition(&ready));
      if (c.closed) {
        failed.swap(c.outgoing);
      } else {
        out = std::move(c.outgoing.front());
        c.outgoing.pop_front();
      }
    }
    if (!failed.empty() || out.sent == nullptr) {
      for (auto& f : failed) f.sent(absl::UnavailableError("the data plane connection ended"));
      return;
    }
    absl::StatusOr<int64_t> sent = SendValues(c.socket, FrameKind::kPull, out.transfer, out.values,
                                              out.type, absl::InfiniteFuture(), out.filling);
    if (!sent.ok()) {
      c.Close();
      sent = absl::UnavailableError(
          absl::StrCat("the data plane connection ended: ", sent.status().message()));
    }
    out.sent(std::move(sent));
  }
}

absl::StatusOr<std::shared_ptr<DataPlane::Connection>> DataPlane::Find(uint64_t connection,
                                                                       int owner) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(connection);
  if (it == open_.end()) return Lost("the connection the call names is not open (it ended?)");
  if (it->second->owner != owner) return Lost("the connection the call names is not its worker's");
  return it->second;
}

absl::Status DataPlane::Receive(uint64_t connection, int owner, uint64_t transfer,
                                absl::Span<float> dst, WireType type, absl::Time deadline,
                                absl::FunctionRef<void()> ready, ValuesSeen seen) {
  absl::StatusOr<std::shared_ptr<Connection>> found = Find(connection, owner);
  if (!found.ok()) return found.status();
  Connection& c = **found;
  if (absl::Status s = c.inbox.Expect(transfer, dst, type, seen); !s.ok()) {
    return s.code() == absl::StatusCode::kFailedPrecondition ? Lost(s.message()) : s;
  }
  ready();
  return c.inbox.Await(transfer, deadline);
}

absl::Status DataPlane::Send(uint64_t connection, int owner, uint64_t transfer,
                             std::shared_ptr<const void> keep, absl::Span<const float> values,
                             WireType type, Sent sent, const FillProgress* filling) {
  absl::StatusOr<std::shared_ptr<Connection>> found = Find(connection, owner);
  if (!found.ok()) return found.status();
  Connection& c = **found;
  absl::MutexLock lock(&c.mu);
  if (c.closed) return Lost("the connection ended");
  if (c.outgoing.size() >= kMaxOutgoing) return Lost("too many answers queued on the connection");
  c.outgoing.push_back({transfer, std::move(keep), values, type, std::move(sent), filling});
  return absl::OkStatus();
}

void DataPlane::Release(int owner) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, c] : open_) {
    if (c->owner == owner) c->Close();
  }
}

}  // namespace ps
