#include "transport/data_plane.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "server/state/cpus.h"
#include "transport/data_frames.h"
#include "transport/frame_inbox.h"
#include "transport/grpc_status.h"

namespace ps {

// One TCP connection of a client's connection: the socket, the parts of Push tensors waiting for
// it (its inbox, read by Serve's thread) and the parts of Pull answers waiting to be sent (by
// SendLoop's thread). Lock order: DataPlane::mu_, then mu (of lanes in order).
class DataPlane::Lane {
 public:
  Lane(Socket s, uint64_t max_frame_bytes)
      : socket(std::move(s)), inbox(&socket, FrameKind::kPush, max_frame_bytes) {}
  // Ends the lane: waits on its socket fail, the threads end, waiting calls wake. `why`: the
  // reason its connection ends, when it is this lane's own (else its reader's failure says).
  void Close(absl::string_view why = "") {
    inbox.End();
    absl::MutexLock lock(&mu);
    if (!closed) why_closed = std::string(why);  // the first reason is the cause
    closed = true;
  }
  bool IsClosed() {
    absl::MutexLock lock(&mu);
    return closed;
  }

  // A part of a Pull's tensor, or a pull call's Answer (`answer`, its payload; `sent` null).
  struct Outgoing {
    uint64_t transfer;
    std::shared_ptr<const void> keep;
    absl::Span<const float> values;
    WireType type = WireType::kFloat32;
    Sent sent;
    const FillProgress* filling = nullptr;  // alive until `sent` (DataPlane::Send)
    int64_t filled_from = 0;                // where `values` start in what `filling` tells of
    absl::Time deadline = absl::InfiniteFuture();  // when the values must be out
    std::string answer = {};                       // an Answer frame's payload (no values)
  };

  // Queues parts[i] on lanes[i], all of them or none (FAILED_PRECONDITION): a caller whose Send
  // failed may free what it would have sent. The lanes' locks are held at once, in order.
  static absl::Status QueueAll(absl::Span<const std::shared_ptr<Lane>> lanes,
                               std::vector<Outgoing>& parts) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  Socket socket;
  FrameInbox inbox;
  std::thread reader, sender;      // sender: started by the reader once its connection is open
  std::atomic<bool> ended{false};  // the reader is done: the threads may be joined
  // It showed a valid ticket: it holds its connection's place, not a place among those saying
  // hello. Written under DataPlane::mu_.
  bool admitted = false;
  // Held while a frame is sent: by the sender for a Pull's tensor, by others for a call's answer.
  absl::Mutex send_mu;

  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  std::string why_closed ABSL_GUARDED_BY(mu);
  std::deque<Outgoing> outgoing ABSL_GUARDED_BY(mu);
};

// A client's connection: its lanes in order, each in place once it said hello. Written under
// DataPlane::mu_; `lanes` is read-only once the connection is open (all in place).
struct DataPlane::Connection {
  uint64_t id = 0;
  int owner = 0;
  Credential credential;
  std::vector<std::shared_ptr<Lane>> lanes;
  size_t joined = 0;    // lanes in place
  bool closed = false;  // its lanes were ended

  std::vector<FrameInbox*> Inboxes() const {
    std::vector<FrameInbox*> inboxes;
    for (const auto& lane : lanes) inboxes.push_back(&lane->inbox);
    return inboxes;
  }
};

namespace {
// Pull answers queued on one connection at most (a worker has at most a few pulls in flight).
constexpr size_t kMaxOutgoing = 16;

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

int DataPlane::AutoLanes() { return std::clamp(UsableCpus() / 4, 1, 4); }

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Start(Options options) {
  for (const OwnerKind& kind : options.owner_kinds) {
    if (kind.count < 1 || !ReservedOwner(kind.first) ||
        !ReservedOwner(kind.first + kind.count - 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data plane: the owners of ", kind.who, " are not reserved ones"));
    }
  }
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Listen(options.host, options.port);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<DataPlane> plane(new DataPlane(std::move(options), *std::move(listener)));
  plane->accepting_ = std::thread([p = plane.get()] { p->AcceptLoop(); });
  return plane;
}

DataPlane::DataPlane(Options options, std::unique_ptr<Listener> listener)
    : options_(std::move(options)), listener_(std::move(listener)) {}

const DataPlane::OwnerKind* DataPlane::KindOf(int owner) const {
  if (!ReservedOwner(owner)) return nullptr;
  for (const OwnerKind& kind : options_.owner_kinds) {
    if (owner >= kind.first && owner - kind.first < kind.count) return &kind;
  }
  return nullptr;
}

std::string DataPlane::Who(int owner) const {
  if (const OwnerKind* kind = KindOf(owner); kind != nullptr) return kind->who;
  if (ReservedOwner(owner)) return absl::StrCat("reserved owner ", owner);
  return absl::StrCat(owner >= 0 ? "worker " : "observer ", owner);
}

void DataPlane::Stop() {
  listener_->Shutdown();
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  std::vector<std::shared_ptr<Connection>> connections;  // lanes may wait for the rest
  for (const auto& [id, issued] : tickets_) connections.push_back(issued.connection);
  for (const auto& [id, c] : open_) connections.push_back(c);
  for (const auto& c : connections) CloseLanes(*c, "the shard is stopping");
  tickets_.clear();
  for (const auto& lane : all_) lane->Close();
}

DataPlane::~DataPlane() {
  Stop();
  TakeCalls({});  // every call answered
  accepting_.join();
  Reap(/*all=*/true);
}

int DataPlane::port() const { return listener_->port(); }

int DataPlane::connections() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(open_.size());
}

absl::StatusOr<DataPlane::Ticket> DataPlane::Issue(int owner, Credential credential) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("the shard is shutting down");
  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<Connection>> unused;  // expired, or this worker's older ticket
  for (const auto& [id, issued] : tickets_) {
    if (issued.expires < now || (!ObserverOwner(owner) && issued.connection->owner == owner)) {
      unused.push_back(issued.connection);
    }
  }
  for (const auto& c : unused) CloseLanes(*c, "its ticket expired or was replaced");
  // The clients holding places: each worker once (this one's open connection is about to be
  // replaced), each observer's connection or ticket apiece.
  std::set<int> owners;
  int observers = 0;
  auto count = [&](const Connection& c) {
    if (ObserverOwner(c.owner)) {
      ++observers;
    } else if (c.owner != owner) {
      owners.insert(c.owner);
    }
  };
  for (const auto& [id, issued] : tickets_) count(*issued.connection);
  for (const auto& [id, c] : open_) count(*c);
  if (ObserverOwner(owner) && observers >= kMaxObserverConnections) {
    return absl::ResourceExhaustedError(
        absl::StrCat("observers hold ", kMaxObserverConnections,
                     " data-plane connections and tickets already (pull over gRPC meanwhile)"));
  }
  if (static_cast<int>(owners.size()) + observers >= options_.max_connections) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the data plane has ", options_.max_connections,
                     " connections and tickets already (ps --data_plane_clients)"));
  }
  auto connection = std::make_shared<Connection>();
  connection->id = RandomId();
  connection->owner = owner;
  connection->credential = credential;
  connection->lanes.resize(options_.lanes);
  Ticket ticket{connection->id, RandomSecret(), options_.lanes};
  tickets_[ticket.connection] = Issued{connection, ticket.secret, now + options_.hello};
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
    auto lane = std::make_shared<Lane>(*std::move(s), options_.max_frame_bytes);
    absl::MutexLock lock(&mu_);
    if (stopped_) continue;  // closed at once
    // Sockets that showed no ticket yet hold no place a client needs: they share
    // kMaxSayingHello, and the oldest (in all_'s order) makes room for this one.
    std::vector<Lane*> saying_hello;
    for (const auto& l : all_) {
      if (!l->admitted && !l->IsClosed()) saying_hello.push_back(l.get());
    }
    if (saying_hello.size() >= static_cast<size_t>(kMaxSayingHello)) {
      saying_hello.front()->Close("closed before its hello to make room for a newer socket");
      if (int64_t held_back = 0; evicted_.Allow(&held_back)) {
        PS_LOG(INFO) << "data plane: " << kMaxSayingHello << " sockets are saying hello; the "
                     << "oldest was closed to make room (and " << held_back
                     << " more since the last such line)";
      }
    }
    all_.push_back(lane);
    lane->reader = std::thread([this, lane] { Serve(lane); });
  }
}

void DataPlane::Reap(bool all) {
  std::vector<std::shared_ptr<Lane>> ended;
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
  for (const auto& lane : ended) {
    lane->reader.join();  // the sender is set (or not) before the reader ends
    if (lane->sender.joinable()) lane->sender.join();
  }
}

absl::StatusOr<std::shared_ptr<DataPlane::Connection>> DataPlane::Admit(
    const std::shared_ptr<Lane>& lane) {
  Socket& socket = lane->socket;
  const absl::Time deadline = absl::Now() + options_.hello;
  if (options_.tls != nullptr) {
    if (absl::Status s = socket.Secure(*options_.tls, "", deadline); !s.ok()) {
      if (int64_t held_back = 0; failed_handshakes_.Allow(&held_back)) {
        const std::string more =
            held_back > 0 ? absl::StrCat(" (and ", held_back, " more since, not logged)") : "";
        PS_LOG(INFO) << "data plane: a connection failed its " << s.message() << more;
      }
      return s;
    }
  }
  absl::StatusOr<FrameHeader> hello = ReceiveHeader(socket, deadline);
  if (!hello.ok()) return hello.status();
  auto refuse = [&](const std::string& why) {
    SendFrame(socket, {FrameKind::kRefused}, why, absl::Now() + absl::Seconds(1)).IgnoreError();
    return absl::PermissionDeniedError(why);
  };
  if (hello->kind != FrameKind::kHello || hello->bytes != kHelloBytes) {
    return refuse(
        "the first frame must be a hello with a ticket and a lane (a client of another version?)");
  }
  std::string payload(kHelloBytes, '\0'), secret;
  if (absl::Status s = socket.Receive(payload.data(), payload.size(), deadline); !s.ok()) return s;
  const size_t index = static_cast<size_t>(HelloLane(payload, &secret));
  std::shared_ptr<Connection> connection;
  std::string refused;
  {
    absl::MutexLock lock(&mu_);
    auto it = tickets_.find(hello->transfer);
    const bool valid = it != tickets_.end() && it->second.expires >= absl::Now() &&
                       SameSecret(it->second.secret, secret) && !it->second.connection->closed;
    Connection* c = valid ? it->second.connection.get() : nullptr;
    if (c == nullptr) {
      refused =
          "unknown, used or expired ticket (ask this shard for one with AttachDataPlane, "
          "authorised with the job's token)";
    } else if (index >= c->lanes.size() || c->lanes[index] != nullptr) {
      refused = absl::StrCat("lane ", index, " is not one of the ticket's ", c->lanes.size(),
                             " or has said hello already");
    } else {
      connection = it->second.connection;
      c->lanes[index] = lane;
      lane->admitted = true;
      if (const OwnerKind* kind = KindOf(c->owner);
          kind != nullptr && kind->stall > absl::ZeroDuration()) {
        socket.set_stall(kind->stall);
      }
      if (++c->joined == c->lanes.size()) {
        tickets_.erase(it);
        if (c->owner >= 0 || ReservedOwner(c->owner)) {  // a newer one replaces the older
          for (const auto& [id, other] : open_) {
            if (other->owner == c->owner) CloseLanes(*other, "replaced by a newer one");
          }
        }
        open_[c->id] = connection;
      }
    }
  }
  if (!refused.empty()) return refuse(refused);
  if (absl::Status s = SendFrame(socket, {FrameKind::kWelcome}, "", deadline); !s.ok()) {
    Close(*connection, s);
    return s;
  }
  return connection;
}

absl::Status DataPlane::AwaitLanes(Connection& c, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return c.closed || c.joined == c.lanes.size();
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  if (c.closed) return absl::UnavailableError("the connection ended while its lanes said hello");
  if (c.joined == c.lanes.size()) return absl::OkStatus();
  const std::string why = absl::StrCat("only ", c.joined, " of the connection's ", c.lanes.size(),
                                       " lanes said hello in time");
  CloseLanes(c, why);
  return absl::DeadlineExceededError(why);
}

void DataPlane::CloseLanes(Connection& c, absl::string_view why) {
  if (c.closed) return;
  c.closed = true;
  if (auto it = tickets_.find(c.id); it != tickets_.end() && it->second.connection.get() == &c) {
    tickets_.erase(it);  // no lane joins it now
  }
  for (const auto& lane : c.lanes) {
    if (lane != nullptr) lane->Close();
  }
  if (c.joined == c.lanes.size()) {
    PS_LOG(INFO) << "data plane: connection of " << Who(c.owner) << " ended (" << why << ")";
  }
}

void DataPlane::Close(Connection& c, const absl::Status& why) {
  std::shared_ptr<const CallHandlers> told;  // of the connection's end, once
  {
    absl::MutexLock lock(&mu_);
    CloseLanes(c, why.message());
    if (auto it = open_.find(c.id); it != open_.end() && it->second.get() == &c) {
      open_.erase(it);
      if (handlers_ != nullptr && handlers_->ended != nullptr) {
        told = handlers_;
        ++calls_running_;
      }
    }
  }
  if (told == nullptr) return;
  told->ended(c.id);
  absl::MutexLock lock(&mu_);
  --calls_running_;
}

void DataPlane::Serve(std::shared_ptr<Lane> lane) {
  absl::StatusOr<std::shared_ptr<Connection>> admitted = Admit(lane);
  absl::Status status = admitted.status();
  if (status.ok()) status = AwaitLanes(**admitted, absl::Now() + options_.hello);
  if (status.ok()) {
    const Connection& c = **admitted;
    if (c.lanes.front() == lane) {
      PS_LOG(INFO) << "data plane: connection of " << Who(c.owner) << " open (" << c.lanes.size()
                   << (c.lanes.size() == 1 ? " lane)" : " lanes)");
    }
    if (c.lanes.front() == lane) {  // (a weak reference: the lane holds it)
      lane->inbox.TakeCalls([this, weak = std::weak_ptr<Lane>(lane), &c](
                                FrameKind kind, uint64_t transfer, std::string payload) {
        return OnCall(weak.lock(), c, kind, transfer, std::move(payload));
      });
    }
    lane->sender = std::thread([this, lane] { SendLoop(*lane); });
    status = lane->inbox.ReadLoop();
    absl::MutexLock lock(&lane->mu);
    if (!lane->why_closed.empty()) status = absl::UnavailableError(lane->why_closed);
  }
  if (admitted.ok()) Close(**admitted, status);
  lane->Close();
  if (!lane->sender.joinable()) {  // admitted but never open: fail what was queued meanwhile
    std::deque<Lane::Outgoing> failed;
    {
      absl::MutexLock lock(&lane->mu);
      failed.swap(lane->outgoing);
    }
    for (auto& f : failed) {
      if (f.sent != nullptr) f.sent(absl::UnavailableError("the data plane connection ended"));
    }
  }
  lane->ended.store(true);
}

void DataPlane::SendLoop(Lane& lane) {
  for (;;) {
    std::deque<Lane::Outgoing> failed;
    std::optional<Lane::Outgoing> out;
    {
      absl::MutexLock lock(&lane.mu);
      auto ready = [&lane]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu) {
        return lane.closed || !lane.outgoing.empty();
      };
      lane.mu.Await(absl::Condition(&ready));
      if (lane.closed) {
        failed.swap(lane.outgoing);
      } else {
        out.emplace(std::move(lane.outgoing.front()));
        lane.outgoing.pop_front();
      }
    }
    if (!out.has_value()) {
      for (auto& f : failed) {
        if (f.sent != nullptr) f.sent(absl::UnavailableError("the data plane connection ended"));
      }
      return;
    }
    if (out->sent == nullptr) {  // an answer
      absl::MutexLock lock(&lane.send_mu);
      if (absl::Status s = SendFrame(lane.socket, {FrameKind::kAnswer, out->transfer}, out->answer,
                                     absl::InfiniteFuture());
          !s.ok()) {
        lane.Close(absl::StrCat("a call's answer could not be sent: ", s.message()));
      }
      continue;
    }
    absl::StatusOr<int64_t> sent;
    {
      absl::MutexLock lock(&lane.send_mu);
      sent = SendValues(lane.socket, FrameKind::kPull, out->transfer, out->values, out->type,
                        out->deadline, out->filling, out->filled_from);
    }
    if (!sent.ok()) {
      lane.Close(absl::StrCat("a pull's values could not be sent: ", sent.status().message()));
      sent = absl::UnavailableError(
          absl::StrCat("the data plane connection ended: ", sent.status().message()));
    }
    out->sent(std::move(sent));
  }
}

absl::Status DataPlane::OnCall(const std::shared_ptr<Lane>& lane, const Connection& c,
                               FrameKind kind, uint64_t transfer, std::string payload) {
  absl::StatusOr<CallFrame> frame = DecodeCall(payload);
  if (!frame.ok()) return frame.status();  // a client of another version?
  const bool pull = kind == FrameKind::kPullCall;
  std::shared_ptr<const CallHandlers> handlers;
  const PushHandler* with_values = nullptr;  // a push's or a change's handler
  {
    absl::MutexLock lock(&mu_);
    if (handlers_ != nullptr) {
      with_values = kind == FrameKind::kChangeCall ? &handlers_->change : &handlers_->push;
      if (pull ? handlers_->pull != nullptr : *with_values != nullptr) {
        handlers = handlers_;
        ++calls_running_;
      }
    }
  }
  if (handlers == nullptr) {
    return SendAnswer(*lane, transfer,
                      {DataPlaneLostStatus("this shard takes no calls on its data plane now"), ""});
  }
  const Call call{c.id,
                  transfer,
                  c.owner,
                  c.credential,
                  absl::Now() + frame->timeout,
                  std::move(frame->request)};
  if (pull) {
    // Answered from any thread, the shard's callbacks' included, which must not block: queued
    // for the lane's sender, after the values (a connection too far behind ends).
    handlers->pull(call, [this, lane, transfer](CallAnswer answer) {
      std::vector<Lane::Outgoing> queued(1);
      queued[0].transfer = transfer;
      queued[0].answer = EncodeAnswer(answer.status, answer.response);
      if (!Lane::QueueAll({lane}, queued).ok()) lane->Close();
      absl::MutexLock lock(&mu_);
      --calls_running_;
    });
    return absl::OkStatus();
  }
  // Its tensor follows at once: read by the call's deadline, or a minute (one sent as a backward
  // pass makes it: kMaxStreamedValues, each piece within the stall).
  const absl::Time now = absl::Now();
  CallAnswer answer = (*with_values)(
      call, [&](absl::Span<float> dst, WireType type, ValuesSeen seen, ValuesOrder order) {
        const absl::Duration limit =
            order == ValuesOrder::kLastPieceFirst ? kMaxStreamedValues : absl::Minutes(1);
        const absl::Time by = std::min(call.deadline, now + limit);
        if (kind == FrameKind::kPushCall &&
            StripeCount(dst.size(), type, static_cast<int>(c.lanes.size())) > 1) {
          return ReadStriped(*lane, c, transfer, dst, type, seen, by, order);
        }
        return lane->inbox.ReadCallValues(transfer, dst, type, seen, by, order);
      });
  {
    absl::MutexLock lock(&mu_);
    --calls_running_;
  }
  if (lane->inbox.ended()) return absl::UnavailableError("the connection ended during a push");
  return SendAnswer(*lane, transfer, answer);
}

absl::Status DataPlane::SendAnswer(Lane& lane, uint64_t transfer, const CallAnswer& answer) {
  return SendBetween(lane, {FrameKind::kAnswer, transfer},
                     EncodeAnswer(answer.status, answer.response));
}

absl::Status DataPlane::SendBetween(Lane& lane, FrameHeader header, std::string_view payload) {
  // Sent from the lane's reading thread, between the sender's frames: the call waits for nothing
  // else.
  absl::Status sent;
  {
    absl::MutexLock lock(&lane.send_mu);
    sent = SendFrame(lane.socket, header, payload, absl::InfiniteFuture());
  }
  if (!sent.ok()) lane.Close();
  return sent;
}

absl::Status DataPlane::ReadStriped(Lane& lane, const Connection& c, uint64_t transfer,
                                    absl::Span<float> dst, WireType type, ValuesSeen seen,
                                    absl::Time deadline, ValuesOrder order) {
  if (order != ValuesOrder::kInOrder) {
    return absl::InvalidArgumentError("a push sent last piece first goes whole on one lane");
  }
  // The other parts expected on their lanes (told of there, at once), then the client told to
  // send them, while the first is read here.
  const std::vector<FrameInbox*> lanes = c.Inboxes();
  if (absl::Status s = ExpectStriped(lanes, transfer, dst, type, seen, /*from=*/1); !s.ok()) {
    return s;
  }
  absl::Status read = SendBetween(lane, {FrameKind::kProceed, transfer}, "");
  if (read.ok()) {
    const Stripe head =
        StripeOf(dst.size(), StripeCount(dst.size(), type, static_cast<int>(lanes.size())), 0);
    read = lane.inbox.ReadCallValues(transfer, dst.subspan(0, head.size), type, seen, deadline);
  }
  absl::Status others = AwaitStriped(lanes, transfer, dst.size(), type,
                                     read.ok() ? deadline : absl::InfinitePast(), IgnoreValues,
                                     /*from=*/1);
  return read.ok() ? others : read;
}

void DataPlane::TakeCalls(CallHandlers handlers) {
  absl::MutexLock lock(&mu_);
  const bool any = handlers.push != nullptr || handlers.pull != nullptr ||
                   handlers.change != nullptr || handlers.ended != nullptr;
  handlers_ = any ? std::make_shared<const CallHandlers>(std::move(handlers)) : nullptr;
  if (!any) {
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_running_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }
}

absl::Status DataPlane::Lane::QueueAll(absl::Span<const std::shared_ptr<Lane>> lanes,
                                       std::vector<Outgoing>& parts) {
  for (const auto& lane : lanes) lane->mu.Lock();
  absl::Status status;
  for (const auto& lane : lanes) {
    if (lane->closed) {
      status = Lost("the connection ended");
    } else if (lane->outgoing.size() >= kMaxOutgoing) {
      status = Lost("too many answers queued on the connection");
    }
  }
  for (size_t i = 0; status.ok() && i < lanes.size(); ++i) {
    lanes[i]->outgoing.push_back(std::move(parts[i]));
  }
  for (const auto& lane : lanes) lane->mu.Unlock();
  return status;
}

absl::StatusOr<std::shared_ptr<DataPlane::Connection>> DataPlane::Find(uint64_t connection,
                                                                       int owner) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(connection);
  if (it == open_.end()) return Lost("the connection the call names is not open (it ended?)");
  if (it->second->owner != owner) return Lost("the connection the call names is not its worker's");
  return it->second;
}

namespace {
// The parts of one Send, each on its lane: the caller's `sent` is called once all are, with the
// values saturated in all or the first failure.
class PartsSent {
 public:
  PartsSent(int parts, DataPlane::Sent sent) : left_(parts), sent_(std::move(sent)) {}
  void One(absl::StatusOr<int64_t> part) {
    DataPlane::Sent sent;
    absl::StatusOr<int64_t> all;
    {
      absl::MutexLock lock(&mu_);
      if (part.ok()) {
        saturated_ += *part;
      } else if (failed_.ok()) {
        failed_ = part.status();
      }
      if (--left_ > 0) return;
      sent = std::move(sent_);
      all = failed_.ok() ? absl::StatusOr<int64_t>(saturated_) : failed_;
    }
    sent(std::move(all));
  }

 private:
  absl::Mutex mu_;
  int left_ ABSL_GUARDED_BY(mu_);
  int64_t saturated_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  DataPlane::Sent sent_ ABSL_GUARDED_BY(mu_);
};
}  // namespace

absl::Status DataPlane::Send(uint64_t connection, int owner, uint64_t transfer,
                             std::shared_ptr<const void> keep, absl::Span<const float> values,
                             WireType type, Sent sent, absl::Time deadline,
                             const FillProgress* filling) {
  absl::StatusOr<std::shared_ptr<Connection>> found = Find(connection, owner);
  if (!found.ok()) return found.status();
  const std::vector<std::shared_ptr<Lane>>& lanes = (*found)->lanes;
  const int parts = StripeCount(values.size(), type, static_cast<int>(lanes.size()));
  auto all = std::make_shared<PartsSent>(parts, std::move(sent));
  deadline = std::min(deadline, absl::Now() + kMaxSend);
  std::vector<Lane::Outgoing> queued;
  for (int i = 0; i < parts; ++i) {
    const Stripe part = StripeOf(values.size(), parts, i);
    queued.push_back({transfer, keep, values.subspan(part.offset, part.size), type,
                      [all](absl::StatusOr<int64_t> s) { all->One(std::move(s)); }, filling,
                      static_cast<int64_t>(part.offset), deadline});
  }
  return Lane::QueueAll(absl::MakeConstSpan(lanes).subspan(0, parts), queued);
}

void DataPlane::Release(int owner, absl::string_view why) {
  absl::MutexLock lock(&mu_);
  // Its open connections, and those still saying hello (their tickets go with them).
  std::vector<std::shared_ptr<Connection>> ending;
  for (const auto& [id, c] : open_) {
    if (c->owner == owner) ending.push_back(c);
  }
  for (const auto& [id, issued] : tickets_) {
    if (issued.connection->owner == owner) ending.push_back(issued.connection);
  }
  const OwnerKind* kind = KindOf(owner);
  for (const auto& c : ending) CloseLanes(*c, kind != nullptr ? kind->released : why);
}

}  // namespace ps
