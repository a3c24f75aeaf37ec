// The bulk data plane (transport/data_plane.h, transport/data_connection.h): on its own in this
// process, then real `ps` processes on 127.0.0.1 whose remote-style clients (no shared memory)
// move tensors over it. Who may connect, what a cut or a stalled peer does (the call fails,
// nothing is applied, the shard goes on), and that the client falls back to gRPC by itself.
#include "transport/data_plane.h"

#include <arpa/inet.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "client/sharded_client.h"
#include "common/fill_progress.h"
#include "deploy/local_cluster.h"
#include "proto/ps.grpc.pb.h"
#include "server/replication/replica.h"
#include "tests/run_dir.h"
#include "tests/steps_in_turn.h"
#include "transport/chunking.h"
#include "transport/data_connection.h"
#include "transport/data_frames.h"
#include "transport/grpc_status.h"
#include "transport/security.h"
#include "transport/shared_memory.h"

namespace ps {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

std::unique_ptr<DataPlane> StartPlane(absl::Duration hello = absl::Seconds(5),
                                      absl::Duration stall = absl::Seconds(10), int lanes = 1) {
  DataPlane::Options o;
  o.max_frame_bytes = 64 << 20;
  o.hello = hello;
  o.stall = stall;
  o.lanes = lanes;
  absl::StatusOr<std::unique_ptr<DataPlane>> plane = DataPlane::Start(o);
  EXPECT_TRUE(plane.ok()) << plane.status();
  return plane.ok() ? *std::move(plane) : nullptr;
}

// The plane's open connections once they are `n`, or after 10 s: an ended connection is let go
// of by its reading thread a moment after its call learned of it.
int ConnectionsSoon(const DataPlane& plane, int n) {
  for (absl::Time end = Soon(); plane.connections() != n && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return plane.connections();
}

// A raw connection that says hello with (id, secret) as lane `lane` and returns the shard's
// answer.
absl::StatusOr<FrameHeader> Hello(Socket& socket, uint64_t id, const std::string& secret,
                                  int lane = 0) {
  if (absl::Status s =
          SendFrame(socket, {FrameKind::kHello, id}, HelloPayload(secret, lane), Soon());
      !s.ok()) {
    return s;
  }
  return ReceiveHeader(socket, Soon());
}

Socket Connect(const DataPlane& plane) {
  absl::StatusOr<Socket> s = Socket::Connect("127.0.0.1", plane.port(), Soon(), absl::Seconds(5));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Socket();
}

TEST(DataPlaneTest, AConnectionNeedsATicketOfThisShardOnce) {
  std::unique_ptr<DataPlane> plane = StartPlane();
  ASSERT_NE(plane, nullptr);
  // No ticket at all (made up), and a ticket with a wrong secret: refused, saying why.
  absl::StatusOr<DataPlane::Ticket> ticket = plane->Issue(3);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  for (auto [id, secret] : {std::pair<uint64_t, std::string>{RandomId(), RandomSecret()},
                            {ticket->connection, RandomSecret()}}) {
    Socket s = Connect(*plane);
    absl::StatusOr<FrameHeader> answer = Hello(s, id, secret);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->kind, FrameKind::kRefused);
    std::string why(answer->bytes, '\0');
    ASSERT_TRUE(s.Receive(why.data(), why.size(), Soon()).ok());
    EXPECT_NE(why.find("ticket"), std::string::npos) << why;
  }
  // A wrong secret used the ticket up? No: a ticket is used by the hello that presents it whole.
  Socket good = Connect(*plane);
  absl::StatusOr<FrameHeader> welcome = Hello(good, ticket->connection, ticket->secret);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->kind, FrameKind::kWelcome);
  // Once: the same ticket again is refused.
  Socket again = Connect(*plane);
  absl::StatusOr<FrameHeader> refused = Hello(again, ticket->connection, ticket->secret);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->kind, FrameKind::kRefused);
  EXPECT_EQ(plane->connections(), 1);
}

TEST(DataPlaneTest, APeerThatSaysNoHelloOrSpeaksAnotherProtocolIsCutOff) {
  std::unique_ptr<DataPlane> plane = StartPlane(/*hello=*/absl::Milliseconds(300));
  ASSERT_NE(plane, nullptr);
  Socket silent = Connect(*plane);
  char byte;
  // The shard closes it once the hello is overdue: the read ends (it does not wait forever).
  EXPECT_EQ(silent.Receive(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  Socket http = Connect(*plane);
  const std::string get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(http.Send(get.data(), get.size(), Soon()).ok());
  EXPECT_EQ(http.Receive(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ConnectionsSoon(*plane, 0), 0);
}

// A connection made with a fresh ticket of `owner`'s.
Socket Open(DataPlane& plane, int owner, uint64_t* id) {
  absl::StatusOr<DataPlane::Ticket> ticket = plane.Issue(owner);
  EXPECT_TRUE(ticket.ok()) << ticket.status();
  Socket s = Connect(plane);
  absl::StatusOr<FrameHeader> welcome = Hello(s, ticket->connection, ticket->secret);
  EXPECT_TRUE(welcome.ok() && welcome->kind == FrameKind::kWelcome);
  *id = ticket->connection;
  return s;
}

// Push calls on a plane, each read into `dst` as `type` by the call's deadline, `seen` told of
// each run on the thread that read it (a test's stand-in for the shard's push handler).
struct PushesInto {
  absl::Span<float> dst;
  WireType type = WireType::kFloat32;
  std::function<void(absl::Span<const float>)> seen = [](absl::Span<const float>) {};
  absl::Mutex mu;
  std::vector<absl::Status> reads ABSL_GUARDED_BY(mu);  // how each call's read ended

  DataPlane::PushHandler Handler() {
    return [this](const DataPlane::Call&, DataPlane::ReadValues read_values) {
      absl::Status read = read_values(
          dst, type, [&](absl::Span<const float> run) { seen(run); }, ValuesOrder::kInOrder);
      absl::MutexLock lock(&mu);
      reads.push_back(read);
      return DataPlane::CallAnswer{ToGrpcStatus(read), ""};
    };
  }
  // How call `i` (from 0) read its tensor, once it did (UNKNOWN if not within 10 s).
  absl::Status Read(size_t i) {
    absl::MutexLock lock(&mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return reads.size() > i; };
    if (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10))) {
      return absl::UnknownError("the call was not read");
    }
    return reads[i];
  }
};

// A push call's frame (request "h") for `transfer` on a raw lane.
absl::Status SendRawCall(Socket& s, uint64_t transfer, absl::Duration timeout = absl::Seconds(10)) {
  return SendFrame(s, {FrameKind::kPushCall, transfer}, EncodeCall({timeout, "h"}), Soon());
}

// The next frame on a raw lane, which should be `kind` (its payload read and dropped).
absl::Status ReceiveRaw(Socket& s, FrameKind kind) {
  absl::StatusOr<FrameHeader> h = ReceiveHeader(s, Soon());
  if (!h.ok()) return h.status();
  if (h->kind != kind) {
    return absl::DataLossError(absl::StrCat("a frame of kind ", static_cast<int>(h->kind)));
  }
  return Discard(s, h->bytes, Soon());
}

// ps --data_plane_clients: tickets and connections together are bounded (a worker's new ticket
// replaces its open connection), and so are the sockets accepted: threads do not grow with them.
TEST(DataPlaneTest, ConnectionsTicketsAndAcceptedSocketsAreBounded) {
  DataPlane::Options o;
  o.max_connections = 2;
  o.max_frame_bytes = 1 << 20;
  o.hello = absl::Seconds(60);  // no socket below is closed for its missing hello
  absl::StatusOr<std::unique_ptr<DataPlane>> started = DataPlane::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  DataPlane& plane = **started;
  uint64_t id0 = 0, id1 = 0;
  Socket w0 = Open(plane, 0, &id0), w1 = Open(plane, 1, &id1);
  ASSERT_EQ(ConnectionsSoon(plane, 2), 2);
  absl::StatusOr<DataPlane::Ticket> third = plane.Issue(2);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_NE(third.status().message().find("--data_plane_clients"), std::string::npos);
  absl::StatusOr<DataPlane::Ticket> again = plane.Issue(0);  // replaces worker 0's connection
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(plane.Issue(2).status().code(), absl::StatusCode::kResourceExhausted);

  // Sockets that say nothing hold no place a client needs: past kMaxSayingHello of them, the
  // oldest is closed for each new one, without waiting for its hello.
  constexpr int kExtra = 8;
  std::vector<Socket> idle;
  for (int i = 0; i < DataPlane::kMaxSayingHello + kExtra; ++i) idle.push_back(Connect(plane));
  std::vector<char> closed(idle.size(), 0);
  auto count_closed = [&] {
    for (absl::Time end = Soon();
         std::count(closed.begin(), closed.end(), 1) < kExtra && absl::Now() < end;
         absl::SleepFor(absl::Milliseconds(10))) {
      for (size_t i = 0; i < idle.size(); ++i) {
        char byte;
        closed[i] |= idle[i].Receive(&byte, 1, absl::Now() + absl::Milliseconds(1)).code() ==
                     absl::StatusCode::kUnavailable;
      }
    }
    return std::count(closed.begin(), closed.end(), 1);
  };
  EXPECT_EQ(count_closed(), kExtra) << "accepted sockets beyond the bound stayed open";
  EXPECT_EQ(std::count(closed.begin(), closed.begin() + kExtra, 1), kExtra) << "oldest first";
  EXPECT_EQ(plane.connections(), 2);
  // A client with a ticket still gets in (worker 0's new connection replaces its old one).
  Socket newer = Connect(plane);
  absl::StatusOr<FrameHeader> welcome = Hello(newer, again->connection, again->secret);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->kind, FrameKind::kWelcome);
  EXPECT_EQ(ConnectionsSoon(plane, 2), 2);
}

// Tickets per credential: observers hold kMaxObserverConnections between them, and a worker one
// (its new ticket replaces its unused older one), so neither takes the others' places.
TEST(DataPlaneTest, ObserversShareAFewPlacesAndAWorkerHoldsOneTicket) {
  std::unique_ptr<DataPlane> plane = StartPlane();
  ASSERT_NE(plane, nullptr);
  std::vector<DataPlane::Ticket> observers;
  for (int i = 0; i < DataPlane::kMaxObserverConnections; ++i) {
    absl::StatusOr<DataPlane::Ticket> t = plane->Issue(-1);
    ASSERT_TRUE(t.ok()) << t.status();
    observers.push_back(*t);
  }
  absl::Status full = plane->Issue(-1).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("observers hold 4"), std::string::npos) << full;
  absl::StatusOr<DataPlane::Ticket> first = plane->Issue(5), second = plane->Issue(5);
  ASSERT_TRUE(first.ok() && second.ok());
  Socket old_ticket = Connect(*plane);
  absl::StatusOr<FrameHeader> refused = Hello(old_ticket, first->connection, first->secret);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->kind, FrameKind::kRefused) << "replaced by the worker's newer ticket";
  Socket new_ticket = Connect(*plane);
  absl::StatusOr<FrameHeader> welcome = Hello(new_ticket, second->connection, second->secret);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->kind, FrameKind::kWelcome);
  // An observer's connection counts among the observers' places as its ticket did.
  Socket observer = Connect(*plane);
  welcome = Hello(observer, observers[0].connection, observers[0].secret);
  ASSERT_TRUE(welcome.ok() && welcome->kind == FrameKind::kWelcome);
  EXPECT_EQ(plane->Issue(-2).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(DataPlaneTest, APushedTensorGoesIntoItsCallOnlyAndAStrayOneIsDropped) {
  std::unique_ptr<DataPlane> plane = StartPlane();
  ASSERT_NE(plane, nullptr);
  std::vector<float> sent(300000), got(300000, -1.0f);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = 0.5f * i;
  PushesInto into{absl::MakeSpan(got)};
  std::vector<float> seen;
  int runs = 0;
  std::set<std::thread::id> threads;
  into.seen = [&](absl::Span<const float> run) {
    seen.insert(seen.end(), run.begin(), run.end());
    ++runs;
    threads.insert(std::this_thread::get_id());
  };
  plane->TakeCalls({into.Handler(), nullptr, nullptr, nullptr});
  uint64_t id = 0;
  Socket s = Open(*plane, 0, &id);
  // A frame no call waits for (transfer 7) is read and dropped; the connection goes on. The
  // call is told of each value once, in order, in runs, on the thread that reads it.
  ASSERT_TRUE(SendValues(s, FrameKind::kPush, 7, sent, WireType::kFloat32, Soon()).ok());
  ASSERT_TRUE(SendRawCall(s, 8).ok());
  ASSERT_TRUE(SendValues(s, FrameKind::kPush, 8, sent, WireType::kFloat32, Soon()).ok());
  ASSERT_TRUE(ReceiveRaw(s, FrameKind::kAnswer).ok());
  ASSERT_TRUE(into.Read(0).ok()) << into.Read(0);
  EXPECT_EQ(got, sent);
  EXPECT_EQ(seen, sent);
  EXPECT_GE(runs, 1);
  EXPECT_EQ(threads.size(), 1u);
  // A tensor of another size fails its call only, and a 16-bit one is decoded.
  ASSERT_TRUE(SendRawCall(s, 10).ok());
  ASSERT_TRUE(SendValues(s, FrameKind::kPush, 10, absl::MakeConstSpan(sent).subspan(0, 10),
                         WireType::kFloat32, Soon())
                  .ok());
  ASSERT_TRUE(ReceiveRaw(s, FrameKind::kAnswer).ok());
  EXPECT_EQ(into.Read(1).code(), absl::StatusCode::kInvalidArgument);
  into.type = WireType::kBFloat16;
  ASSERT_TRUE(SendRawCall(s, 11).ok());
  ASSERT_TRUE(SendValues(s, FrameKind::kPush, 11, sent, WireType::kBFloat16, Soon()).ok());
  ASSERT_TRUE(ReceiveRaw(s, FrameKind::kAnswer).ok());
  ASSERT_TRUE(into.Read(2).ok());
  EXPECT_EQ(got[2], 1.0f);
  EXPECT_EQ(plane->connections(), 1);
}

// A frame's header saying `bytes` follow, sent alone (as a peer that stops midway would).
void SendHeader(Socket& s, FrameKind kind, uint64_t transfer, uint64_t bytes) {
  char head[24];
  const uint64_t words[3] = {0x31445350u | (static_cast<uint64_t>(kind) << 32), transfer, bytes};
  for (int w = 0; w < 3; ++w) {
    for (int i = 0; i < 8; ++i) head[8 * w + i] = static_cast<char>((words[w] >> (8 * i)) & 0xff);
  }
  ASSERT_TRUE(s.Send(head, sizeof(head), Soon()).ok());
}

// A push call of worker 1 (of `incarnation`), sequence 1, naming connection `connection` and
// transfer 1, for `length` float32 values.
v1::PushHeader RawPushCall(int worker, int64_t incarnation, int64_t length, uint64_t connection) {
  v1::PushHeader h;
  h.set_worker_id(worker);
  h.set_incarnation(incarnation);
  h.set_sequence(1);
  h.set_length(length);
  h.set_dtype(v1::FLOAT32);
  h.mutable_path()->set_data_connection(connection);
  h.mutable_path()->set_data_transfer(1);
  return h;
}

// Opens a raw connection with worker 1's `ticket` and makes a push call (RawPushCall) on it
// whose tensor, `gradient`, stops halfway; then cuts the connection, which the shard ends.
void CutPushCall(const v1::AttachDataPlaneResponse& ticket, int64_t incarnation,
                 absl::Span<const float> gradient) {
  absl::StatusOr<Socket> raw =
      Socket::Connect("127.0.0.1", ticket.port(), Soon(), absl::Seconds(5));
  ASSERT_TRUE(raw.ok()) << raw.status();
  absl::StatusOr<FrameHeader> welcome = Hello(*raw, ticket.connection(), ticket.secret());
  ASSERT_TRUE(welcome.ok() && welcome->kind == FrameKind::kWelcome);
  const v1::PushHeader h = RawPushCall(1, incarnation, gradient.size(), ticket.connection());
  ASSERT_TRUE(SendFrame(*raw, {FrameKind::kPushCall, 1},
                        EncodeCall({absl::Seconds(10), h.SerializeAsString()}), Soon())
                  .ok());
  SendHeader(*raw, FrameKind::kPush, 1, gradient.size() * sizeof(float));
  ASSERT_TRUE(raw->Send(gradient.data(), gradient.size() / 2 * sizeof(float), Soon()).ok());
  raw->Shutdown();
  char byte;
  EXPECT_EQ(raw->Receive(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
}

TEST(DataPlaneTest, ATensorIsStripedInContiguousPartsOneALaneWhenLargeEnough) {
  const size_t big = 3 * kMinStripeBytes / sizeof(float) + 5;
  EXPECT_EQ(StripeCount(1000, WireType::kFloat32, 4), 1);
  EXPECT_EQ(StripeCount(big, WireType::kFloat32, 1), 1);
  EXPECT_EQ(StripeCount(big, WireType::kFloat32, 2), 2);
  EXPECT_EQ(StripeCount(big, WireType::kFloat32, 8), 3);
  EXPECT_EQ(StripeCount(big, WireType::kBFloat16, 8), 1);  // half the bytes
  for (int parts : {1, 2, 3, 7}) {
    size_t next = 0;
    for (int i = 0; i < parts; ++i) {
      const Stripe part = StripeOf(big, parts, i);
      EXPECT_EQ(part.offset, next);
      EXPECT_EQ(part.offset % kStripeAlign, 0u);
      EXPECT_LE(std::max(part.size, big / parts) - std::min(part.size, big / parts), kStripeAlign);
      next += part.size;
    }
    EXPECT_EQ(next, big);
  }
}

// A ticket of a plane with `lanes` lanes: each lane says hello once, the connection is open once
// all have, and a tensor of three stripes' worth goes as one part a lane, both ways.
TEST(DataPlaneTest, AConnectionOfSeveralLanesOpensWhenAllSaidHelloAndStripesLargeTensors) {
  std::unique_ptr<DataPlane> plane = StartPlane(absl::Seconds(5), absl::Seconds(10), 3);
  ASSERT_NE(plane, nullptr);
  absl::StatusOr<DataPlane::Ticket> ticket = plane->Issue(0);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_EQ(ticket->lanes, 3);
  std::vector<Socket> lanes;
  for (int lane : {2, 0}) {
    lanes.push_back(Connect(*plane));
    absl::StatusOr<FrameHeader> welcome =
        Hello(lanes.back(), ticket->connection, ticket->secret, lane);
    ASSERT_TRUE(welcome.ok() && welcome->kind == FrameKind::kWelcome) << lane;
  }
  std::swap(lanes[0], lanes[1]);
  for (int lane : {3, 0}) {  // not the ticket's, and one that said hello already
    Socket s = Connect(*plane);
    absl::StatusOr<FrameHeader> answer = Hello(s, ticket->connection, ticket->secret, lane);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->kind, FrameKind::kRefused) << lane;
  }
  EXPECT_EQ(plane->connections(), 0);
  lanes.insert(lanes.begin() + 1, Connect(*plane));
  absl::StatusOr<FrameHeader> last = Hello(lanes[1], ticket->connection, ticket->secret, 1);
  ASSERT_TRUE(last.ok() && last->kind == FrameKind::kWelcome);
  EXPECT_EQ(plane->connections(), 1);

  const size_t n = 3 * kMinStripeBytes / sizeof(float) + 5;
  std::vector<float> sent(n), got(n, -1.0f);
  for (size_t i = 0; i < n; ++i) sent[i] = static_cast<float>(i % 1000) - 500.0f;
  // A push call: its first part on the first lane, the others once the plane said Proceed. The
  // call is told of each value once, as it comes, in order within a part, each part on its
  // lane's own thread.
  absl::Mutex mu;
  std::vector<int> told(n, 0);
  const size_t second = StripeOf(n, 3, 1).offset, third = StripeOf(n, 3, 2).offset;
  std::vector<size_t> next = {0, second, third};  // where each part's next run should start
  int out_of_order = 0;
  std::set<std::thread::id> threads;
  PushesInto into{absl::MakeSpan(got)};
  into.seen = [&](absl::Span<const float> run) {
    absl::MutexLock lock(&mu);
    const size_t at = run.data() - got.data();
    for (size_t i = at; i < at + run.size(); ++i) ++told[i];
    size_t& part_next = next[at >= third ? 2 : at >= second ? 1 : 0];
    out_of_order += at != part_next;
    part_next = at + run.size();
    threads.insert(std::this_thread::get_id());
  };
  plane->TakeCalls({into.Handler(), nullptr, nullptr, nullptr});
  ASSERT_TRUE(SendRawCall(lanes[0], 2).ok());
  ASSERT_TRUE(ReceiveRaw(lanes[0], FrameKind::kProceed).ok());
  for (int i = 2; i >= 0; --i) {  // the last part first
    const Stripe part = StripeOf(n, 3, i);
    ASSERT_TRUE(SendValues(lanes[i], FrameKind::kPush, 2,
                           absl::MakeConstSpan(sent).subspan(part.offset, part.size),
                           WireType::kFloat32, Soon())
                    .ok());
  }
  ASSERT_TRUE(ReceiveRaw(lanes[0], FrameKind::kAnswer).ok());
  ASSERT_TRUE(into.Read(0).ok()) << into.Read(0);
  EXPECT_EQ(got, sent);
  EXPECT_EQ(std::count(told.begin(), told.end(), 1), static_cast<int64_t>(n));
  EXPECT_EQ(out_of_order, 0);
  EXPECT_EQ(threads.size(), 3u);

  // A pull's values, one part a lane, and `sent` called once, after all of them.
  absl::Notification done;
  absl::StatusOr<int64_t> result;
  ASSERT_TRUE(plane
                  ->Send(
                      ticket->connection, 0, 3, nullptr, sent, WireType::kFloat32,
                      [&](absl::StatusOr<int64_t> r) {
                        result = r;
                        done.Notify();
                      },
                      Soon())
                  .ok());
  std::vector<float> pulled(n, -1.0f);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<FrameHeader> head = ReceiveHeader(lanes[i], Soon());
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->transfer, 3u);
    const Stripe part = StripeOf(n, 3, i);
    ASSERT_TRUE(ReceiveValues(lanes[i], head->bytes,
                              absl::MakeSpan(pulled).subspan(part.offset, part.size),
                              WireType::kFloat32, Soon())
                    .ok());
  }
  EXPECT_EQ(pulled, sent);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(result.ok()) << result.status();

  // A push cut mid-part on one lane fails and ends every lane.
  ASSERT_TRUE(SendRawCall(lanes[0], 5).ok());
  ASSERT_TRUE(ReceiveRaw(lanes[0], FrameKind::kProceed).ok());
  const Stripe first = StripeOf(n, 3, 0);
  ASSERT_TRUE(SendValues(lanes[0], FrameKind::kPush, 5,
                         absl::MakeConstSpan(sent).subspan(first.offset, first.size),
                         WireType::kFloat32, Soon())
                  .ok());
  SendHeader(lanes[1], FrameKind::kPush, 5, StripeOf(n, 3, 1).size * sizeof(float));
  ASSERT_TRUE(lanes[1].Send(sent.data(), 1000 * sizeof(float), Soon()).ok());
  lanes[1].Shutdown();
  EXPECT_EQ(into.Read(1).code(), absl::StatusCode::kUnavailable) << into.Read(1);
  char byte;
  EXPECT_EQ(lanes[2].Receive(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ConnectionsSoon(*plane, 0), 0);
}

// A client's end of a connection of two lanes: a pull it forgets before it came (as a pull the
// shard did not answer) leaves the connection open, and its pushes and pulls go on.
TEST(DataPlaneTest, AClientForgettingATransferThatNeverCameKeepsItsConnection) {
  std::unique_ptr<DataPlane> plane = StartPlane(absl::Seconds(5), absl::Seconds(10), 2);
  ASSERT_NE(plane, nullptr);
  absl::StatusOr<DataPlane::Ticket> ticket = plane->Issue(0);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  absl::StatusOr<std::unique_ptr<DataConnection>> client = DataConnection::Open(
      {"127.0.0.1", plane->port(), ticket->connection, ticket->secret, ticket->lanes}, 64 << 20,
      Soon(), absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  DataConnection& c = **client;
  EXPECT_EQ(c.lanes(), 2);
  const size_t n = 2 * kMinStripeBytes / sizeof(float) + 3;
  std::vector<float> values(n), got(n, -1.0f);
  for (size_t i = 0; i < n; ++i) values[i] = 0.25f * (i % 4000);
  ASSERT_TRUE(c.Expect(1, absl::MakeSpan(got), WireType::kFloat32).ok());
  EXPECT_EQ(c.Await(1, got, WireType::kFloat32, absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(c.ended());
  // A push, striped, then a pull.
  PushesInto into{absl::MakeSpan(got)};
  plane->TakeCalls({into.Handler(), nullptr, nullptr, nullptr});
  absl::StatusOr<DataConnection::Answered> pushed =
      c.PushCall(2, "h", values, WireType::kFloat32, Soon());
  ASSERT_TRUE(pushed.ok() && pushed->status.ok()) << pushed.status() << into.Read(0);
  EXPECT_EQ(got, values);
  std::vector<float> pulled(n, -1.0f);
  ASSERT_TRUE(c.Expect(3, absl::MakeSpan(pulled), WireType::kFloat32).ok());
  absl::Notification sent;
  ASSERT_TRUE(plane
                  ->Send(
                      ticket->connection, 0, 3, nullptr, values, WireType::kFloat32,
                      [&](absl::StatusOr<int64_t>) { sent.Notify(); }, Soon())
                  .ok());
  ASSERT_TRUE(c.Await(3, pulled, WireType::kFloat32, Soon()).ok());
  EXPECT_EQ(pulled, values);
  EXPECT_TRUE(sent.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(plane->connections(), 1);
}

// TLS (transport/tls.h) from a job's PEM files, mutual: every lane's handshake comes before its
// hello, so a client without TLS, one trusting another CA, one without the client certificate
// the job asks for, and one that expects another name on the shard's certificate get no
// connection, and the plane goes on; one with the job's files moves a tensor striped over two
// lanes, and a pull, bit for bit.
TEST(DataPlaneTest, AJobsTlsIsSpokenOnEveryLaneAndNothingOpensWithoutIt) {
  const std::string certs = NewRunDir("tls");
  ASSERT_TRUE(MakeTestCertificates(certs));
  auto pem = [&](const std::string& name) { return certs + "/" + name; };
  absl::StatusOr<ServerSecurity> server =
      LoadServerSecurity({pem("server.pem"), pem("server.key"), pem("ca.pem")}, "", "");
  ASSERT_TRUE(server.ok()) << server.status();
  auto client_tls = [&](const TlsFiles& files) {
    absl::StatusOr<ClientSecurity> s = LoadClientSecurity(files, "");
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->plane_tls : nullptr;
  };
  const auto trusted = client_tls({pem("client.pem"), pem("client.key"), pem("ca.pem")});
  const auto no_certificate = client_tls({"", "", pem("ca.pem")});
  const auto stranger =
      client_tls({pem("other-client.pem"), pem("other-client.key"), pem("other-ca.pem")});
  ASSERT_TRUE(trusted && no_certificate && stranger);

  DataPlane::Options o;
  o.max_frame_bytes = 64 << 20;
  o.lanes = 2;
  o.tls = server->plane_tls;
  absl::StatusOr<std::unique_ptr<DataPlane>> started = DataPlane::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  DataPlane& plane = **started;
  DataPlane::Ticket ticket;
  auto open = [&](std::shared_ptr<const TlsContext> tls) {
    absl::StatusOr<DataPlane::Ticket> issued = plane.Issue(0);
    EXPECT_TRUE(issued.ok()) << issued.status();
    if (issued.ok()) ticket = *issued;
    return DataConnection::Open({"127.0.0.1", plane.port(), ticket.connection, ticket.secret,
                                 ticket.lanes, false, std::move(tls)},
                                64 << 20, Soon(), absl::Seconds(5));
  };
  // (The shard's reason is in its log; the client's, what it can tell.)
  for (const auto& [tls, said] :
       std::vector<std::pair<std::shared_ptr<const TlsContext>, std::string>>{
           {nullptr, "the peer closed the connection"},
           {stranger, "the peer's certificate: self-signed certificate in certificate chain"},
           {no_certificate, "certificate required"}}) {
    absl::StatusOr<std::unique_ptr<DataConnection>> refused = open(tls);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
    EXPECT_NE(refused.status().message().find(said), std::string::npos) << refused.status();
  }
  Socket renamed = Connect(plane);
  absl::Status mismatch = renamed.Secure(*trusted, "ps.example.com", Soon());
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(mismatch.message().find("hostname mismatch"), std::string::npos) << mismatch;
  EXPECT_EQ(plane.connections(), 0);

  absl::StatusOr<std::unique_ptr<DataConnection>> opened = open(trusted);
  ASSERT_TRUE(opened.ok()) << opened.status();
  DataConnection& c = **opened;
  ASSERT_EQ(c.lanes(), 2);
  const size_t n = 2 * kMinStripeBytes / sizeof(float) + 3;
  std::vector<float> values(n), got(n, -1.0f);
  for (size_t i = 0; i < n; ++i) values[i] = 0.25f * (i % 4000) - 7.0f;
  PushesInto into{absl::MakeSpan(got)};
  plane.TakeCalls({into.Handler(), nullptr, nullptr, nullptr});
  absl::StatusOr<DataConnection::Answered> pushed =
      c.PushCall(1, "h", values, WireType::kFloat32, Soon());
  ASSERT_TRUE(pushed.ok() && pushed->status.ok()) << pushed.status() << into.Read(0);
  EXPECT_EQ(got, values);
  std::vector<float> pulled(n, -1.0f);
  ASSERT_TRUE(c.Expect(2, absl::MakeSpan(pulled), WireType::kFloat32).ok());
  ASSERT_TRUE(plane
                  .Send(
                      ticket.connection, 0, 2, nullptr, values, WireType::kFloat32,
                      [](absl::StatusOr<int64_t>) {}, Soon())
                  .ok());
  ASSERT_TRUE(c.Await(2, pulled, WireType::kFloat32, Soon()).ok());
  EXPECT_EQ(pulled, values);
  EXPECT_EQ(plane.connections(), 1);

  // The plane stopping while it writes a pull larger than any socket buffer to a client that
  // reads only its first header: the writes fail on the shut connection (this process lives on:
  // TLS writes raise no SIGPIPE) and the pull is told.
  absl::StatusOr<DataPlane::Ticket> last = plane.Issue(1);
  ASSERT_TRUE(last.ok()) << last.status();
  std::vector<Socket> idle;
  for (int lane = 0; lane < 2; ++lane) {
    idle.push_back(Connect(plane));
    ASSERT_TRUE(idle.back().Secure(*trusted, "127.0.0.1", Soon()).ok());
    absl::StatusOr<FrameHeader> welcome = Hello(idle.back(), last->connection, last->secret, lane);
    ASSERT_TRUE(welcome.ok() && welcome->kind == FrameKind::kWelcome) << lane;
  }
  const std::vector<float> big(16 << 20, 1.0f);
  absl::Notification told;
  absl::Status why;
  ASSERT_TRUE(plane
                  .Send(
                      last->connection, 1, 3, nullptr, big, WireType::kFloat32,
                      [&](absl::StatusOr<int64_t> r) {
                        why = r.status();
                        told.Notify();
                      },
                      absl::InfiniteFuture())
                  .ok());
  ASSERT_TRUE(ReceiveHeader(idle[0], Soon()).ok());  // it is writing
  plane.Stop();
  ASSERT_TRUE(told.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;
}

// A client's connection (DataConnection, making calls) with a fresh ticket of `owner`'s, which
// goes into `ticket` if asked for; null if it cannot be opened.
std::unique_ptr<DataConnection> OpenClient(DataPlane& plane, int owner,
                                           DataPlane::Ticket* ticket = nullptr) {
  absl::StatusOr<DataPlane::Ticket> issued = plane.Issue(owner);
  EXPECT_TRUE(issued.ok()) << issued.status();
  if (!issued.ok()) return nullptr;
  if (ticket != nullptr) *ticket = *issued;
  absl::StatusOr<std::unique_ptr<DataConnection>> client = DataConnection::Open(
      {"127.0.0.1", plane.port(), issued->connection, issued->secret, issued->lanes, true},
      64 << 20, Soon(), absl::Seconds(5));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// A push made on the connection itself goes to the handler with its header and deadline, its
// tensor read by the handler into its own buffer (or dropped when it reads none), and is answered
// on the connection, between the frames of a large pull sent meanwhile; with no handler it is
// answered "data plane lost".
TEST(DataPlaneTest, APushCallGoesToTheHandlerAndIsAnsweredOnTheConnection) {
  std::unique_ptr<DataPlane> plane = StartPlane();
  ASSERT_NE(plane, nullptr);
  std::vector<float> got;
  std::vector<DataPlane::Call> calls;
  DataPlane::PushHandler push = [&](const DataPlane::Call& call,
                                    DataPlane::ReadValues read_values) {
    calls.push_back(call);
    DataPlane::CallAnswer answer;
    if (call.request == "refuse") {
      answer.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no, thanks", "detail");
      return answer;
    }
    got.assign(call.request == "short" ? 10 : 1000, 0.0f);
    const WireType type = call.request == "bf16" ? WireType::kBFloat16 : WireType::kFloat32;
    size_t seen = 0;
    absl::Status read = read_values(
        absl::MakeSpan(got), type, [&](absl::Span<const float> run) { seen += run.size(); },
        ValuesOrder::kInOrder);
    answer.status = ToGrpcStatus(read);
    answer.response = absl::StrCat("seen ", seen);
    return answer;
  };
  plane->TakeCalls({push, nullptr, nullptr, nullptr});
  DataPlane::Ticket ticket;
  std::unique_ptr<DataConnection> client = OpenClient(*plane, 3, &ticket);
  ASSERT_NE(client, nullptr);
  DataConnection& c = *client;
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * i;

  absl::StatusOr<DataConnection::Answered> answered =
      c.PushCall(5, "read", values, WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_TRUE(answered->status.ok()) << answered->status.error_message();
  EXPECT_EQ(answered->response, "seen 1000");
  EXPECT_EQ(got, values);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].connection, ticket.connection);
  EXPECT_EQ(calls[0].transfer, 5u);
  EXPECT_EQ(calls[0].owner, 3);
  EXPECT_GT(calls[0].deadline, absl::Now() + absl::Seconds(5));
  EXPECT_LT(calls[0].deadline, Soon() + absl::Seconds(1));

  // Refused without reading its tensor: answered with the status as made (details too), and the
  // tensor dropped; a tensor of another size fails its call only; a bf16 one is decoded.
  answered = c.PushCall(6, "refuse", values, WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(answered->status.error_message(), "no, thanks");
  EXPECT_EQ(answered->status.error_details(), "detail");
  EXPECT_EQ(answered->response, "");
  answered = c.PushCall(7, "short", values, WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  answered = c.PushCall(8, "bf16", values, WireType::kBFloat16, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_TRUE(answered->status.ok());
  EXPECT_EQ(got[3], 1.5f);

  // While a 32 MiB pull goes out on the same lane, a push call is answered between its frames.
  const auto big = std::make_shared<std::vector<float>>(8 << 20);
  for (size_t i = 0; i < big->size(); ++i) (*big)[i] = static_cast<float>(i % 1000);
  std::vector<float> pulled(big->size(), -1.0f);
  ASSERT_TRUE(c.Expect(9, absl::MakeSpan(pulled), WireType::kFloat32).ok());
  absl::Notification sent;
  ASSERT_TRUE(plane
                  ->Send(
                      ticket.connection, 3, 9, big, *big, WireType::kFloat32,
                      [&](absl::StatusOr<int64_t>) { sent.Notify(); }, Soon())
                  .ok());
  answered = c.PushCall(10, "read", values, WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_TRUE(answered->status.ok());
  ASSERT_TRUE(c.Await(9, pulled, WireType::kFloat32, Soon()).ok());
  EXPECT_EQ(pulled, *big);
  EXPECT_TRUE(sent.WaitForNotificationWithTimeout(absl::Seconds(10)));

  // No handler (its shard service is going away): the client is told to use gRPC.
  plane->TakeCalls({});
  answered = c.PushCall(11, "read", values, WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_TRUE(IsDataPlaneLost(answered->status)) << answered->status.error_message();
  EXPECT_EQ(calls.size(), 5u);
  EXPECT_FALSE(c.ended());
  EXPECT_EQ(plane->connections(), 1);
}

// A pull made on the connection itself goes to the handler, which answers later (from another
// thread): its values, striped over the lanes when large, come before the answer; a refused one
// sends none, and its place is forgotten.
// A push whose values a backward pass still fills in, from the end: sent last piece first as they
// become final, each piece read into its place as it comes, the scan told of every value once.
TEST(DataPlaneTest, APushCallSentLastPieceFirstArrivesWhileItsFirstPiecesAreStillComing) {
  std::unique_ptr<DataPlane> plane = StartPlane();
  ASSERT_NE(plane, nullptr);
  const size_t n = 2 * kFillPiece + 12345;  // three pieces, the last one short
  std::vector<float> got(n, -1.0f);
  std::vector<int> told(n, 0);
  absl::Notification last_piece_in;
  DataPlane::PushHandler push = [&](const DataPlane::Call&, DataPlane::ReadValues read_values) {
    absl::Status read = read_values(
        absl::MakeSpan(got), WireType::kFloat32,
        [&](absl::Span<const float> run) {
          const size_t at = run.data() - got.data();
          for (size_t i = at; i < at + run.size(); ++i) ++told[i];
          if (at + run.size() == n) last_piece_in.Notify();
        },
        ValuesOrder::kLastPieceFirst);
    return DataPlane::CallAnswer{ToGrpcStatus(read), "read"};
  };
  plane->TakeCalls({push, nullptr, nullptr, nullptr});
  std::unique_ptr<DataConnection> client = OpenClient(*plane, 3);
  ASSERT_NE(client, nullptr);
  std::vector<float> values(n, 0.0f);
  FillProgress filled(static_cast<int64_t>(n));  // counted from the end
  absl::StatusOr<DataConnection::Answered> answered;
  std::thread call([&] {
    answered = client->PushCall(5, "read", values, WireType::kFloat32, Soon(), FrameKind::kPushCall,
                                &filled, ValuesOrder::kLastPieceFirst);
  });
  // The last piece, final: it arrives while the rest is not even computed.
  for (size_t i = 2 * kFillPiece; i < n; ++i) values[i] = 0.25f * i;
  filled.Add(n - 2 * kFillPiece);
  ASSERT_TRUE(last_piece_in.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(got[n - 1], 0.25f * (n - 1));
  EXPECT_EQ(got[0], -1.0f);
  for (size_t i = 0; i < 2 * kFillPiece; ++i) values[i] = 0.25f * i;
  filled.Add(2 * kFillPiece - 1000);  // values come in runs that end anywhere
  filled.Add(1000);
  call.join();
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_TRUE(answered->status.ok()) << answered->status.error_message();
  EXPECT_EQ(got, values);
  EXPECT_EQ(std::count(told.begin(), told.end(), 1), static_cast<int64_t>(n));

  // Last piece first is float32's alone: refused before anything is sent.
  Socket unused;
  EXPECT_EQ(SendValues(unused, FrameKind::kPush, 1, values, WireType::kBFloat16, Soon(), nullptr, 0,
                       ValuesOrder::kLastPieceFirst)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A push sent as backward makes it whose backward stalls: the shard cuts the connection once no
// byte came for its stall, and the client's send, waiting for the next piece, ends then too (not
// kMaxFillWait later).
TEST(DataPlaneTest, APushCallSentAsFilledEndsWhenTheShardCutsItsStalledConnection) {
  std::unique_ptr<DataPlane> plane = StartPlane(absl::Seconds(5), absl::Milliseconds(300));
  ASSERT_NE(plane, nullptr);
  const size_t n = 2 * kFillPiece + 12345;
  std::vector<float> got(n, -1.0f);
  absl::Notification last_piece_in, read;
  absl::Status read_status;
  DataPlane::PushHandler push = [&](const DataPlane::Call&, DataPlane::ReadValues read_values) {
    read_status = read_values(
        absl::MakeSpan(got), WireType::kFloat32,
        [&](absl::Span<const float> run) {
          if (run.data() + run.size() == got.data() + n) last_piece_in.Notify();
        },
        ValuesOrder::kLastPieceFirst);
    DataPlane::CallAnswer answer{ToGrpcStatus(read_status), ""};
    read.Notify();  // the test's locals may be gone once it is told
    return answer;
  };
  plane->TakeCalls({push, nullptr, nullptr, nullptr});
  std::unique_ptr<DataConnection> client = OpenClient(*plane, 3);
  ASSERT_NE(client, nullptr);
  std::vector<float> values(n, 1.0f);
  FillProgress filled(static_cast<int64_t>(n));
  filled.Add(n - 2 * kFillPiece);  // the last piece, and then backward stalls
  const absl::Time start = absl::Now();
  absl::StatusOr<DataConnection::Answered> answered =
      client->PushCall(5, "read", values, WireType::kFloat32, Soon(), FrameKind::kPushCall,
                       &filled, ValuesOrder::kLastPieceFirst);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(last_piece_in.HasBeenNotified());
  EXPECT_EQ(answered.status().code(), absl::StatusCode::kUnavailable) << answered.status();
  EXPECT_TRUE(client->ended());
  ASSERT_TRUE(read.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(read_status.ok());  // the shard's read stalled, and it cut the connection
  EXPECT_LT(took, kMaxFillWait / 2) << "the send waited for values after the shard cut it";
}

TEST(DataPlaneTest, APullCallIsAnsweredAfterItsValues) {
  std::unique_ptr<DataPlane> plane = StartPlane(absl::Seconds(5), absl::Seconds(10), 2);
  ASSERT_NE(plane, nullptr);
  const size_t n = 3 * kMinStripeBytes / sizeof(float);
  const auto values = std::make_shared<std::vector<float>>(n);
  for (size_t i = 0; i < n; ++i) (*values)[i] = 0.25f * (i % 4000);
  std::vector<std::thread> answering;
  DataPlane::PullHandler pull = [&](const DataPlane::Call& call, DataPlane::Answer answer) {
    auto done = std::make_shared<DataPlane::Answer>(std::move(answer));
    if (call.request == "refuse") {
      answering.emplace_back([done] {
        (*done)({grpc::Status(grpc::StatusCode::ABORTED, "held back"), ""});
      });
      return;
    }
    ASSERT_TRUE(plane
                    ->Send(
                        call.connection, call.owner, call.transfer, values, *values,
                        WireType::kFloat32,
                        [done](absl::StatusOr<int64_t> sent) {
                          (*done)({ToGrpcStatus(sent.status()), "head"});
                        },
                        call.deadline)
                    .ok());
  };
  plane->TakeCalls({nullptr, pull, nullptr, nullptr});
  std::unique_ptr<DataConnection> client = OpenClient(*plane, 2);
  ASSERT_NE(client, nullptr);
  DataConnection& c = *client;
  std::vector<float> got(n, -1.0f);
  absl::StatusOr<DataConnection::Answered> answered =
      c.PullCall(1, "pull", absl::MakeSpan(got), WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_TRUE(answered->status.ok()) << answered->status.error_message();
  EXPECT_EQ(answered->response, "head");
  EXPECT_EQ(got, *values);
  std::vector<float> untouched(n, -1.0f);
  answered = c.PullCall(2, "refuse", absl::MakeSpan(untouched), WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(untouched, std::vector<float>(n, -1.0f));
  // A push call where the shard takes only pulls: answered "data plane lost".
  answered = c.PushCall(3, "push", *values, WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_TRUE(IsDataPlaneLost(answered->status));
  // And the pull again, on the same connection.
  std::fill(got.begin(), got.end(), -1.0f);
  answered = c.PullCall(4, "pull", absl::MakeSpan(got), WireType::kFloat32, Soon());
  ASSERT_TRUE(answered.ok() && answered->status.ok());
  EXPECT_EQ(got, *values);
  for (std::thread& t : answering) t.join();
  EXPECT_FALSE(c.ended());
}

// What ends a connection that makes push calls: a call frame that is not one, a tensor frame
// of another transfer after a call, a cut mid-tensor (the handler's read fails; no answer).
TEST(DataPlaneTest, AMalformedOrCutPushCallEndsItsConnection) {
  std::unique_ptr<DataPlane> plane = StartPlane();
  ASSERT_NE(plane, nullptr);
  std::atomic<int> read_failures{0};
  plane->TakeCalls({[&](const DataPlane::Call&, DataPlane::ReadValues read_values) {
                      std::vector<float> dst(1000);
                      absl::Status read = read_values(absl::MakeSpan(dst), WireType::kFloat32,
                                                      IgnoreValues, ValuesOrder::kInOrder);
                      read_failures += !read.ok();
                      return DataPlane::CallAnswer{ToGrpcStatus(read), ""};
                    },
                    nullptr, nullptr, nullptr});
  const std::vector<float> values(1000, 1.0f);
  char byte;
  {
    uint64_t id = 0;
    Socket s = Open(*plane, 0, &id);
    ASSERT_TRUE(SendFrame(s, {FrameKind::kPushCall, 1}, "short", Soon()).ok());
    EXPECT_EQ(s.Receive(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  }
  {
    uint64_t id = 0;
    Socket s = Open(*plane, 0, &id);
    ASSERT_TRUE(
        SendFrame(s, {FrameKind::kPushCall, 1}, EncodeCall({absl::Seconds(5), "h"}), Soon()).ok());
    ASSERT_TRUE(SendValues(s, FrameKind::kPush, 2, values, WireType::kFloat32, Soon()).ok());
    EXPECT_EQ(s.Receive(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  }
  {
    uint64_t id = 0;
    Socket s = Open(*plane, 0, &id);
    ASSERT_TRUE(
        SendFrame(s, {FrameKind::kPushCall, 1}, EncodeCall({absl::Seconds(5), "h"}), Soon()).ok());
    SendHeader(s, FrameKind::kPush, 1, values.size() * sizeof(float));
    ASSERT_TRUE(s.Send(values.data(), values.size() * sizeof(float) / 2, Soon()).ok());
    s.Shutdown();
  }
  EXPECT_EQ(ConnectionsSoon(*plane, 0), 0);
  for (absl::Time end = Soon(); read_failures.load() < 2 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(read_failures.load(), 2);  // the wrong frame's and the cut one's
}

// The first lane of a fresh ticket of worker 0's, welcomed, its other lanes not yet there.
Socket FirstLaneOnly(DataPlane& plane) {
  absl::StatusOr<DataPlane::Ticket> ticket = plane.Issue(0);
  EXPECT_TRUE(ticket.ok()) << ticket.status();
  Socket first = Connect(plane);
  absl::StatusOr<FrameHeader> welcome = Hello(first, ticket->connection, ticket->secret, 0);
  EXPECT_TRUE(welcome.ok() && welcome->kind == FrameKind::kWelcome);
  return first;
}

// Stopping a plane whose connection waits for its other lanes ends at once.
TEST(DataPlaneTest, StoppingEndsAConnectionStillWaitingForItsLanes) {
  std::unique_ptr<DataPlane> plane = StartPlane(absl::Seconds(30), absl::Seconds(10), 2);
  ASSERT_NE(plane, nullptr);
  Socket first = FirstLaneOnly(*plane);
  const absl::Time start = absl::Now();
  plane.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // not the 30 s hello
}

TEST(DataPlaneTest, ALaneThatNeverSaysHelloClosesTheOthersOnceTheHelloIsOverdue) {
  std::unique_ptr<DataPlane> plane =
      StartPlane(/*hello=*/absl::Milliseconds(300), absl::Seconds(10), 2);
  ASSERT_NE(plane, nullptr);
  Socket first = FirstLaneOnly(*plane);
  char byte;
  EXPECT_EQ(first.Receive(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(plane->connections(), 0);
}

TEST(DataPlaneTest, ACutMidTensorFailsTheCallAndTheConnectionOnly) {
  std::unique_ptr<DataPlane> plane = StartPlane();
  ASSERT_NE(plane, nullptr);
  std::vector<float> dst(1 << 18, -1.0f);
  PushesInto into{absl::MakeSpan(dst)};
  plane->TakeCalls({into.Handler(), nullptr, nullptr, nullptr});
  uint64_t id = 0;
  Socket s = Open(*plane, 0, &id);
  const std::vector<float> half(dst.size() / 2, 2.0f);
  ASSERT_TRUE(SendRawCall(s, 1).ok());
  SendHeader(s, FrameKind::kPush, 1, dst.size() * sizeof(float));
  ASSERT_TRUE(s.Send(half.data(), half.size() * sizeof(float), Soon()).ok());
  s.Shutdown();
  EXPECT_EQ(into.Read(0).code(), absl::StatusCode::kUnavailable) << into.Read(0);
  // The connection is gone; the plane takes others.
  uint64_t other = 0;
  Socket t = Open(*plane, 1, &other);
  EXPECT_EQ(ConnectionsSoon(*plane, 1), 1);
}

// A striped push call whose deadline passes while a part is still coming ends the connection,
// and nothing is written into its buffer after the handler's read returned.
TEST(DataPlaneTest, ACallThatGivesUpMidTensorEndsTheConnectionAndIsNotWrittenAfter) {
  std::unique_ptr<DataPlane> plane = StartPlane(absl::Seconds(5), absl::Seconds(10), 2);
  ASSERT_NE(plane, nullptr);
  const size_t n = 2 * kMinStripeBytes / sizeof(float);
  std::vector<float> dst(n, -1.0f);
  PushesInto into{absl::MakeSpan(dst)};
  plane->TakeCalls({into.Handler(), nullptr, nullptr, nullptr});
  absl::StatusOr<DataPlane::Ticket> ticket = plane->Issue(0);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  std::vector<Socket> lanes;
  for (int lane = 0; lane < 2; ++lane) {
    lanes.push_back(Connect(*plane));
    absl::StatusOr<FrameHeader> welcome =
        Hello(lanes.back(), ticket->connection, ticket->secret, lane);
    ASSERT_TRUE(welcome.ok() && welcome->kind == FrameKind::kWelcome) << lane;
  }
  const Stripe first = StripeOf(n, 2, 0), second = StripeOf(n, 2, 1);
  const std::vector<float> values(n, 2.0f);
  ASSERT_TRUE(SendRawCall(lanes[0], 1, absl::Milliseconds(500)).ok());
  ASSERT_TRUE(ReceiveRaw(lanes[0], FrameKind::kProceed).ok());
  ASSERT_TRUE(SendValues(lanes[0], FrameKind::kPush, 1,
                         absl::MakeConstSpan(values).subspan(first.offset, first.size),
                         WireType::kFloat32, Soon())
                  .ok());
  SendHeader(lanes[1], FrameKind::kPush, 1, second.size * sizeof(float));
  ASSERT_TRUE(lanes[1].Send(values.data(), second.size / 2 * sizeof(float), Soon()).ok());
  // ... and the rest never comes in time.
  EXPECT_EQ(into.Read(0).code(), absl::StatusCode::kDeadlineExceeded) << into.Read(0);
  // The rest arrives late: nothing is written into the call's buffer any more.
  std::vector<float> before = dst;
  lanes[1]
      .Send(values.data(), (second.size - second.size / 2) * sizeof(float),
            absl::Now() + absl::Seconds(1))
      .IgnoreError();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(dst, before);
  EXPECT_EQ(ConnectionsSoon(*plane, 0), 0);
}

// Sends 64 MiB of a pull's values on connection `id` (worker 0's) of `plane`, to be out by
// `deadline`; how the send ended, waiting up to 90 s for it (DEADLINE_EXCEEDED then).
absl::StatusOr<int64_t> SendPull(DataPlane& plane, uint64_t id, absl::Time deadline) {
  struct Sent {
    absl::Notification done;
    absl::StatusOr<int64_t> outcome;
  };
  auto sent = std::make_shared<Sent>();  // the callback may come after this returned
  auto values = std::make_shared<std::vector<float>>(16 << 20, 1.0f);
  absl::Status queued = plane.Send(
      id, 0, 1, values, *values, WireType::kFloat32,
      [sent](absl::StatusOr<int64_t> outcome) {
        sent->outcome = std::move(outcome);
        sent->done.Notify();
      },
      deadline);
  if (!queued.ok()) return queued;
  if (!sent->done.WaitForNotificationWithTimeout(absl::Seconds(90))) {
    return absl::DeadlineExceededError("the send went on 90 s");
  }
  return sent->outcome;
}

// A client that stops reading ends its connection within the stall; one that keeps reading, but
// a trickle, never stalls it: the call's deadline ends the send, and the connection with it, so
// the lane and the values are held that long at most; and what waits for a client is bounded.
TEST(DataPlaneTest, AClientReadingSlowlyEndsItsConnectionAtTheStallOrTheCallsDeadline) {
  std::unique_ptr<DataPlane> stalled =
      StartPlane(absl::Seconds(5), /*stall=*/absl::Milliseconds(300));
  ASSERT_NE(stalled, nullptr);
  uint64_t id = 0;
  Socket never_read = Open(*stalled, 0, &id);
  absl::Time start = absl::Now();
  absl::StatusOr<int64_t> outcome = SendPull(*stalled, id, absl::InfiniteFuture());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kUnavailable) << outcome.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(ConnectionsSoon(*stalled, 0), 0);

  std::unique_ptr<DataPlane> plane = StartPlane(absl::Seconds(5), /*stall=*/absl::Seconds(5));
  ASSERT_NE(plane, nullptr);
  Socket s = Open(*plane, 0, &id);
  std::atomic<bool> stop{false};
  std::thread trickle([&] {  // 64 KiB every 50 ms: 1.3 MB/s (64 MiB in 51 s), never a stall
    std::vector<char> sink(64 << 10);
    while (!stop.load() && s.Receive(sink.data(), sink.size(), Soon()).ok()) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  start = absl::Now();
  outcome = SendPull(*plane, id, start + absl::Seconds(3));
  stop.store(true);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kUnavailable) << outcome.status();
  EXPECT_GE(absl::Now() - start, absl::Seconds(3));
  EXPECT_LT(absl::Now() - start, absl::Seconds(25)) << "the send went on past its deadline";
  EXPECT_EQ(ConnectionsSoon(*plane, 0), 0);
  trickle.join();

  // One that reads nothing holds what the shard queued for it and no more: at most 16 sends a lane
  // wait (the rest are refused at once, their values the caller's to free), and once the
  // connection ends at the stall every queued send is told so and its values are let go.
  constexpr int kSends = 40;
  std::vector<std::shared_ptr<std::vector<float>>> made;  // made first: the sends go at once
  for (int i = 0; i < kSends; ++i) made.push_back(std::make_shared<std::vector<float>>(2 << 20));
  Socket none_read = Open(*stalled, 0, &id);
  auto told = std::make_shared<std::atomic<int>>(0);
  int queued = 0;
  for (int i = 0; i < kSends; ++i) {
    queued += stalled
                  ->Send(
                      id, 0, i + 1, made[i], *made[i], WireType::kFloat32,
                      [told](absl::StatusOr<int64_t>) { ++*told; }, absl::InfiniteFuture())
                  .ok();
  }
  const std::vector<std::weak_ptr<std::vector<float>>> values(made.begin(), made.end());
  made.clear();
  // 16 waiting, one being written, and what the sockets' buffers took whole: far from all.
  EXPECT_GE(queued, 16);
  EXPECT_LT(queued, kSends);
  auto held = [&] {
    return std::count_if(values.begin(), values.end(),
                         [](const std::weak_ptr<std::vector<float>>& w) { return !w.expired(); });
  };
  EXPECT_LE(held(), queued);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while ((held() > 0 || told->load() < queued) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(held(), 0) << "values still held after the connection stalled";
  EXPECT_EQ(told->load(), queued);
  EXPECT_EQ(ConnectionsSoon(*stalled, 0), 0);
}

// A pull's values go out while the shard still copies them (FillProgress): the client gets the
// frame whole, the same as one sent after the copy, as float32 and as bf16, wherever the copy's
// pieces end.
TEST(DataPlaneTest, ValuesSentWhileTheyAreFilledArriveAsIfSentWhole) {
  std::unique_ptr<DataPlane> plane = StartPlane();
  ASSERT_NE(plane, nullptr);
  uint64_t id = 0;
  Socket s = Open(*plane, 0, &id);
  std::vector<float> source(3 * kChunkFloats + 12345);
  for (size_t i = 0; i < source.size(); ++i) source[i] = 0.001f * static_cast<float>(i % 7919) - 3;
  uint64_t transfer = 0;
  // Sends the source (with `filled`, copied in by another thread in uneven pieces as it goes),
  // returns what came.
  auto send = [&](WireType type, bool filled) {
    auto buffer = std::make_shared<std::vector<float>>(source.size(), std::nanf(""));
    if (!filled) *buffer = source;
    auto filling = std::make_shared<FillProgress>(static_cast<int64_t>(source.size()));
    absl::Notification done;
    absl::StatusOr<int64_t> outcome;
    EXPECT_TRUE(plane
                    ->Send(
                        id, 0, ++transfer, filling, *buffer, type,
                        [&](absl::StatusOr<int64_t> sent) {
                          outcome = sent;
                          done.Notify();
                        },
                        Soon(), filled ? filling.get() : nullptr)
                    .ok());
    std::vector<float> got(source.size(), -1.0f);
    absl::StatusOr<FrameHeader> head = ReceiveHeader(s, Soon());
    // Filled only once the frame has begun: the sender waits for each piece.
    std::thread filler([&] {
      for (size_t i = 0; filled && i < source.size();) {
        const size_t n = std::min<size_t>(source.size() - i, 100003 + i % 7);
        std::copy_n(source.begin() + i, n, buffer->begin() + i);
        filling->Add(static_cast<int64_t>(n));
        i += n;
      }
    });
    EXPECT_TRUE(head.ok()) << head.status();
    if (head.ok()) {
      EXPECT_EQ(head->kind, FrameKind::kPull);
      EXPECT_EQ(head->transfer, transfer);
      absl::Status received = ReceiveValues(s, head->bytes, absl::MakeSpan(got), type, Soon());
      EXPECT_TRUE(received.ok()) << received;
    }
    filler.join();
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(outcome.ok()) << outcome.status();
    return got;
  };
  EXPECT_EQ(send(WireType::kFloat32, true), source);
  EXPECT_EQ(send(WireType::kBFloat16, true), send(WireType::kBFloat16, false));
}

TEST(FillProgressTest, AWaitEndsWhenEnoughIsInPlaceOrAtItsDeadline) {
  FillProgress p(10);
  EXPECT_EQ(p.WaitFor(1, absl::Now() + absl::Milliseconds(20)), 0);  // nothing yet: the deadline
  p.Add(4);
  EXPECT_EQ(p.WaitFor(3, Soon()), 4);
  std::thread rest([&] { p.Add(100); });  // at most the total counts
  EXPECT_EQ(p.WaitFor(20, Soon()), 10);   // more than the total: all of it
  rest.join();
}

// --- Real shards ---

constexpr int kParams = 300000;  // more than one gRPC chunk
const ModelIdentity kModel{"flat:300000", kParams, 1};

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// A client's options on another host than its shards' (no shared memory), retrying for 30 s.
ClientOptions Remote() {
  ClientOptions options;
  options.shared_memory = false;
  options.retry_for = absl::Seconds(30);
  return options;
}

// One shard of kModel (SGD, lr 0.5) for two workers with a token, initialised to 0.25 * (i % 100).
class DataPlaneShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/token") << token_;
    ClusterSecurity security;
    security.token_file = dir_ + "/token";
    cluster_ = std::make_unique<LocalCluster>(ExecutableDir(), dir_ + "/run", security);
    ASSERT_TRUE(
        cluster_->StartShards(1, kModel.fingerprint, 2, {"--optimizer=sgd", "--lr=0.5"}).ok());
    worker0_ = Client(0);
    ASSERT_TRUE(worker0_->Register().ok());
    for (int i = 0; i < kParams; ++i) initial_[i] = 0.25f * (i % 100);
    ASSERT_EQ(*worker0_->Initialize(initial_), 1);
  }
  std::unique_ptr<ShardedClient> Client(int worker, bool data_plane = true,
                                        const std::string& token = "sesame") {
    ClientOptions options;
    options.shared_memory = false;  // as a client on another host
    options.data_plane = data_plane;
    options.security.token = token;
    options.retry_for = absl::Seconds(20);
    return std::make_unique<ShardedClient>(std::vector<std::string>{cluster_->ShardAddress(0)},
                                           kModel, worker, options);
  }
  v1::StatsResponse ShardStats() {
    std::unique_ptr<ShardedClient> observer = Client(-1, false);
    absl::StatusOr<std::vector<v1::StatsResponse>> stats = observer->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? (*stats)[0] : v1::StatsResponse();
  }
  // A raw gRPC Push to the shard with the job's token, on `context` (given a 10 s deadline).
  std::unique_ptr<grpc::ClientWriter<v1::PushChunk>> RawGrpcPush(grpc::ClientContext* context,
                                                                 v1::PushResponse* response) {
    if (stub_ == nullptr) {
      stub_ = v1::ParameterServer::NewStub(
          grpc::CreateChannel(cluster_->ShardAddress(0), grpc::InsecureChannelCredentials()));
    }
    context->set_deadline(In(absl::Seconds(10)));
    context->AddMetadata("authorization", "Bearer " + token_);
    return stub_->Push(context, response);
  }
  // A raw data-plane connection of worker `worker`'s (the job's token), its hello said: it takes
  // the place of the worker's own.
  void OpenRawConnection(int worker, v1::AttachDataPlaneResponse* ticket, Socket* out) {
    ASSERT_TRUE(Attach(worker, token_, ticket).ok());
    absl::StatusOr<Socket> raw =
        Socket::Connect("127.0.0.1", ticket->port(), Soon(), absl::Seconds(5));
    ASSERT_TRUE(raw.ok()) << raw.status();
    absl::StatusOr<FrameHeader> welcome = Hello(*raw, ticket->connection(), ticket->secret());
    ASSERT_TRUE(welcome.ok() && welcome->kind == FrameKind::kWelcome);
    *out = *std::move(raw);
  }
  // A raw AttachDataPlane as `worker` of `model` with `token` ("": none).
  grpc::Status Attach(int worker, const std::string& token, v1::AttachDataPlaneResponse* response,
                      const std::string& address = "", const ModelIdentity& model = kModel) {
    return RawAttachDataPlane(address.empty() ? cluster_->ShardAddress(0) : address, worker, model,
                              token, response);
  }
  // Worker `worker` of `model` on `primary` (no token), registered over gRPC, with a data-plane
  // connection of its own (one lane) and a push call's header naming it (RawPushCall): for a
  // push a test makes a piece at a time.
  struct RawWorker {
    std::unique_ptr<ShardedClient> registered;
    std::unique_ptr<DataConnection> connection;
    v1::PushHeader header;
  };
  void OpenRawWorker(int worker, const std::string& primary, const ModelIdentity& model,
                     RawWorker* out) {
    ClientOptions grpc_only = Remote();
    grpc_only.data_plane = false;  // its own connection would replace the raw one
    out->registered = std::make_unique<ShardedClient>(std::vector<std::string>{primary}, model,
                                                      worker, grpc_only);
    ASSERT_TRUE(out->registered->Register().ok());
    v1::AttachDataPlaneResponse ticket;
    ASSERT_TRUE(Attach(worker, "", &ticket, primary, model).ok());
    EXPECT_FALSE(ticket.last_piece_first()) << "a primary forwarding pushes takes them in order";
    absl::StatusOr<std::unique_ptr<DataConnection>> c = DataConnection::Open(
        {"127.0.0.1", ticket.port(), ticket.connection(), ticket.secret(), 1, true},
        model.total_params * sizeof(float), Soon(), absl::Seconds(10));
    ASSERT_TRUE(c.ok()) << c.status();
    out->connection = *std::move(c);
    out->header = RawPushCall(worker, out->registered->incarnation(0), model.total_params,
                              out->connection->id());
  }

  const std::string token_ = "sesame";
  const std::string dir_ = NewRunDir("data-plane");
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<ShardedClient> worker0_;
  std::vector<float> initial_ = std::vector<float>(kParams);
  std::unique_ptr<v1::ParameterServer::Stub> stub_;  // RawGrpcPush's
};

TEST_F(DataPlaneShardTest, RemoteClientsMoveTensorsOverItWithTheSameResults) {
  std::vector<float> gradient(kParams);
  for (int i = 0; i < kParams; ++i) gradient[i] = 0.001f * (i % 7);
  // Worker 0 over the data plane, worker 1 over gRPC's streams, in turn: the same SGD steps.
  std::unique_ptr<ShardedClient> worker1 = Client(1, /*data_plane=*/false);
  ASSERT_TRUE(worker1->Register().ok());
  ExpectStepsInTurnAgree(*worker0_, *worker1, initial_, gradient, 0.5f);
  if (HasFatalFailure()) return;
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.data_plane_pushes(), 2);
  EXPECT_EQ(stats.data_plane_pulls(), 3);
  EXPECT_EQ(stats.pushes_applied(), 4);
  EXPECT_EQ(stats.data_plane_connections(), 1);  // worker 1 asked for none
}

// The shard scans a gradient run by run as it comes in (over the plane and over gRPC): a value
// that is not finite, wherever it is, still refuses the whole push, naming it, with nothing
// applied; a finite one is applied as before.
TEST_F(DataPlaneShardTest, ANonFiniteValueAnywhereRefusesThePushOverEitherPath) {
  std::unique_ptr<ShardedClient> worker1 = Client(1, /*data_plane=*/false);
  ASSERT_TRUE(worker1->Register().ok());
  std::vector<float> gradient(kParams, 0.5f);
  for (ShardedClient* worker : {worker0_.get(), worker1.get()}) {
    for (int at : {0, 250001, kParams - 1}) {
      gradient[at] = at == 0 ? std::numeric_limits<float>::infinity()
                             : std::numeric_limits<float>::quiet_NaN();
      absl::StatusOr<ShardedClient::PushSummary> refused = worker->Push(gradient);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
      EXPECT_NE(refused.status().message().find(absl::StrCat("offset ", at)), std::string::npos)
          << refused.status();
      gradient[at] = 0.5f;
    }
  }
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.version(), 0);
  EXPECT_EQ(stats.pushes_rejected(), 6);
  EXPECT_EQ(stats.data_plane_pushes(), 0);
  ASSERT_TRUE(worker0_->Push(gradient).ok());
  std::vector<float> weights(kParams);
  ASSERT_TRUE(worker0_->Pull(absl::MakeSpan(weights)).ok());
  for (int i = 0; i < kParams; ++i) ASSERT_EQ(weights[i], initial_[i] - 0.25f) << i;
  EXPECT_EQ(ShardStats().data_plane_pushes(), 1);
}

TEST_F(DataPlaneShardTest, ATicketNeedsTheJobsTokenAndOpensThisShardOnly) {
  v1::AttachDataPlaneResponse ticket;
  EXPECT_EQ(Attach(0, "", &ticket).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Attach(0, "guess", &ticket).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // A client of another job: a ticket from that job's shard opens nothing here.
  LocalCluster other(ExecutableDir(), dir_ + "/other");
  ASSERT_TRUE(other.StartShards(1, kModel.fingerprint, 2, {}).ok());
  ASSERT_TRUE(Attach(0, "", &ticket, other.ShardAddress(0)).ok());
  v1::AttachDataPlaneResponse ours;
  ASSERT_TRUE(Attach(0, token_, &ours).ok());
  absl::StatusOr<std::unique_ptr<DataConnection>> stranger = DataConnection::Open(
      {"127.0.0.1", ours.port(), ticket.connection(), ticket.secret(), ticket.lanes()}, kParams * 4,
      Soon(), absl::Seconds(5));
  ASSERT_FALSE(stranger.ok());
  EXPECT_NE(stranger.status().message().find("refused"), std::string::npos) << stranger.status();
  // With this shard's own ticket: open.
  absl::StatusOr<std::unique_ptr<DataConnection>> opened = DataConnection::Open(
      {"127.0.0.1", ours.port(), ours.connection(), ours.secret(), ours.lanes()}, kParams * 4,
      Soon(), absl::Seconds(5));
  EXPECT_TRUE(opened.ok()) << opened.status();
}

TEST_F(DataPlaneShardTest, APushCutMidTensorAppliesNothingAndTheClientFallsBackToGrpc) {
  // A raw connection of worker 0's, and a raw push naming it whose tensor stops halfway.
  v1::AttachDataPlaneResponse ticket;
  Socket raw_socket;
  OpenRawConnection(0, &ticket, &raw_socket);
  if (HasFatalFailure()) return;
  Socket* raw = &raw_socket;
  grpc::ClientContext context;
  v1::PushResponse response;
  // A gRPC Push naming the connection is refused: a push's tensor on the plane is a call there.
  auto writer = RawGrpcPush(&context, &response);
  v1::PushChunk chunk;
  *chunk.mutable_header() = RawPushCall(0, worker0_->incarnation(0), kParams, ticket.connection());
  ASSERT_TRUE(writer->Write(chunk));
  writer->WritesDone();
  grpc::Status named = writer->Finish();
  EXPECT_EQ(named.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << named.error_message();
  // A push call on it whose tensor stops halfway: the shard ends the connection.
  const v1::PushHeader h = RawPushCall(0, worker0_->incarnation(0), kParams, ticket.connection());
  ASSERT_TRUE(SendFrame(*raw, {FrameKind::kPushCall, 1},
                        EncodeCall({absl::Seconds(10), h.SerializeAsString()}), Soon())
                  .ok());
  const std::vector<float> gradient(kParams, 1.0f);
  SendHeader(*raw, FrameKind::kPush, 1, kParams * sizeof(float));
  ASSERT_TRUE(raw->Send(gradient.data(), kParams / 2 * sizeof(float), Soon()).ok());
  raw->Shutdown();
  char byte;
  EXPECT_EQ(raw->Receive(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.pushes_applied(), 0);
  EXPECT_EQ(stats.version(), 0);

  // A client whose connection is cut (here: its socket shut down from this process) finds out on
  // its next push, which goes over gRPC at once and is applied once. (Worker 0's own connection
  // was replaced by the raw one above: worker 1's.)
  std::unique_ptr<ShardedClient> worker1 = Client(1);
  ASSERT_TRUE(worker1->Register().ok());
  std::vector<float> weights(kParams);
  ASSERT_TRUE(worker1->Pull(absl::MakeSpan(weights)).ok());
  ASSERT_EQ(ShardStats().data_plane_pulls(), 1);
  for (int fd = 3; fd < 1024; ++fd) {
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    if (peer.ss_family == AF_INET &&
        ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port) == ticket.port()) {
      shutdown(fd, SHUT_RDWR);
    }
  }
  absl::StatusOr<ShardedClient::PushSummary> pushed = worker1->Push(gradient);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->duplicates, 0);
  ASSERT_TRUE(worker1->Pull(absl::MakeSpan(weights)).ok());
  EXPECT_EQ(weights[1], initial_[1] - 0.5f);
  stats = ShardStats();
  EXPECT_EQ(stats.pushes_applied(), 1);
  EXPECT_EQ(stats.version(), 1);
  EXPECT_EQ(stats.data_plane_pushes(), 0);  // it went over gRPC
  EXPECT_EQ(stats.data_plane_pulls(), 1);   // and so did the pull after it
}

// A push made on the connection itself (a tensor in one part) is the connection owner's, names
// the connection and the call's transfer, and is applied whole or not at all: another worker's,
// one naming something else, one of an earlier shard process and one cut mid-tensor change
// nothing; the owner's is applied once.
TEST_F(DataPlaneShardTest, APushMadeOnTheConnectionIsItsOwnersAndAppliedWholeOrNotAtAll) {
  v1::AttachDataPlaneResponse ticket;
  ASSERT_TRUE(Attach(0, token_, &ticket).ok());
  ASSERT_TRUE(ticket.calls());
  absl::StatusOr<std::unique_ptr<DataConnection>> opened = DataConnection::Open(
      {"127.0.0.1", ticket.port(), ticket.connection(), ticket.secret(), ticket.lanes(), true},
      kParams * 4, Soon(), absl::Seconds(5));
  ASSERT_TRUE(opened.ok()) << opened.status();
  DataConnection& c = **opened;
  const std::vector<float> gradient(kParams, 1.0f);
  auto push = [&](uint64_t transfer, auto change) {
    v1::PushHeader h;
    h.set_worker_id(0);
    h.set_incarnation(worker0_->incarnation(0));
    h.set_sequence(100);
    h.set_offset(0);
    h.set_length(kParams);
    h.set_dtype(v1::FLOAT32);
    h.mutable_path()->set_data_connection(c.id());
    h.mutable_path()->set_data_transfer(transfer);
    change(h);
    absl::StatusOr<DataConnection::Answered> answered =
        c.PushCall(transfer, h.SerializeAsString(), gradient, WireType::kFloat32, Soon());
    EXPECT_TRUE(answered.ok()) << answered.status();
    return answered.ok() ? answered->status : grpc::Status(grpc::StatusCode::UNKNOWN, "none");
  };
  EXPECT_EQ(push(1, [](v1::PushHeader& h) { h.set_worker_id(1); }).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(push(2, [](v1::PushHeader& h) { h.mutable_path()->set_data_transfer(7); }).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(push(3, [](v1::PushHeader& h) { h.set_dtype(v1::TOPK); }).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(IsShardRestarted(push(4, [](v1::PushHeader& h) { h.set_shard_incarnation(12345); })));
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.version(), 0);
  EXPECT_EQ(stats.pushes_applied(), 0);
  EXPECT_EQ(stats.data_plane_pushes(), 0);

  // Cut mid-tensor on a raw connection of worker 1's: nothing applied.
  v1::AttachDataPlaneResponse raw_ticket;
  ASSERT_TRUE(Attach(1, token_, &raw_ticket).ok());
  std::unique_ptr<ShardedClient> worker1 = Client(1, /*data_plane=*/false);
  ASSERT_TRUE(worker1->Register().ok());
  CutPushCall(raw_ticket, worker1->incarnation(0), gradient);
  stats = ShardStats();
  EXPECT_EQ(stats.version(), 0);
  EXPECT_EQ(stats.pushes_applied(), 0);

  // The owner's push: applied once, the same push again a duplicate.
  ASSERT_TRUE(push(5, [](v1::PushHeader&) {}).ok());
  grpc::Status again = push(6, [](v1::PushHeader&) {});
  ASSERT_TRUE(again.ok()) << again.error_message();
  std::vector<float> weights(kParams);
  ASSERT_TRUE(worker1->Pull(absl::MakeSpan(weights)).ok());
  EXPECT_EQ(weights[3], initial_[3] - 0.5f);
  stats = ShardStats();
  EXPECT_EQ(stats.version(), 1);
  EXPECT_EQ(stats.pushes_applied(), 1);
  EXPECT_EQ(stats.pushes_duplicate(), 1);
  EXPECT_EQ(stats.pushes_rejected(), 4);  // another worker's, the two malformed, the cut one
  EXPECT_EQ(stats.data_plane_pushes(), 2);

  // Pulls made on the connection: the owner's only, into the caller's buffer.
  auto pull = [&](uint64_t transfer, int worker, std::vector<float>* into) {
    v1::PullRequest r;
    r.set_worker_id(worker);
    r.set_length(kParams);
    r.set_dtype(v1::FLOAT32);
    r.mutable_model()->set_fingerprint(kModel.fingerprint);
    r.mutable_model()->set_total_params(kModel.total_params);
    r.mutable_model()->set_num_shards(kModel.num_shards);
    r.mutable_path()->set_data_connection(c.id());
    r.mutable_path()->set_data_transfer(transfer);
    absl::StatusOr<DataConnection::Answered> answered = c.PullCall(
        transfer, r.SerializeAsString(), absl::MakeSpan(*into), WireType::kFloat32, Soon());
    EXPECT_TRUE(answered.ok()) << answered.status();
    return answered.ok() ? answered->status : grpc::Status(grpc::StatusCode::UNKNOWN, "none");
  };
  std::vector<float> pulled(kParams, -1.0f);
  EXPECT_EQ(pull(7, 1, &pulled).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(pulled, std::vector<float>(kParams, -1.0f));
  grpc::Status own = pull(8, 0, &pulled);
  ASSERT_TRUE(own.ok()) << own.error_message();
  EXPECT_EQ(pulled, weights);
  EXPECT_EQ(ShardStats().data_plane_pulls(), 1);
}

// Pulls made on the data plane wait at a sync barrier as gRPC's do, without a thread, as many at
// once as the shard takes (--max_pulls): one more is refused at once; the held ones get the
// round's weights once it is complete.
TEST_F(DataPlaneShardTest, PullCallsHeldAtASyncBarrierAreBoundedAndAnsweredWhenTheRoundEnds) {
  LocalCluster sync(ExecutableDir(), dir_ + "/sync");
  ASSERT_TRUE(sync.StartShards(1, kModel.fingerprint, 2,
                               {"--consistency=sync", "--optimizer=sgd", "--lr=0.5",
                                "--max_pulls=4", "--lease_seconds=600"})
                  .ok());
  ClientOptions options;
  options.shared_memory = false;
  options.data_plane = false;
  options.retry_for = absl::Seconds(20);
  ShardedClient worker0({sync.ShardAddress(0)}, kModel, 0, options);
  ShardedClient worker1({sync.ShardAddress(0)}, kModel, 1, options);
  ASSERT_TRUE(worker0.Register().ok());
  ASSERT_TRUE(worker1.Register().ok());
  ASSERT_TRUE(worker0.Initialize(initial_).ok());
  const std::vector<float> gradient(kParams, 1.0f);
  ASSERT_TRUE(worker0.Push(gradient, 0).ok());  // the round waits for worker 1
  v1::AttachDataPlaneResponse ticket;
  ASSERT_TRUE(Attach(0, "", &ticket, sync.ShardAddress(0)).ok());
  absl::StatusOr<std::unique_ptr<DataConnection>> opened = DataConnection::Open(
      {"127.0.0.1", ticket.port(), ticket.connection(), ticket.secret(), ticket.lanes(), true},
      kParams * 4, Soon(), absl::Seconds(5));
  ASSERT_TRUE(opened.ok()) << opened.status();
  DataConnection& c = **opened;
  constexpr int kPulls = 5;
  std::vector<std::vector<float>> got(kPulls, std::vector<float>(kParams, -1.0f));
  std::vector<grpc::Status> answers(kPulls);
  std::atomic<int> refused{0};
  std::vector<std::thread> pulls;
  for (int i = 0; i < kPulls; ++i) {
    pulls.emplace_back([&, i] {
      v1::PullRequest r;
      r.set_worker_id(0);
      r.set_length(kParams);
      r.mutable_model()->set_fingerprint(kModel.fingerprint);
      r.mutable_model()->set_total_params(kModel.total_params);
      r.mutable_model()->set_num_shards(kModel.num_shards);
      r.mutable_path()->set_data_connection(c.id());
      r.mutable_path()->set_data_transfer(i + 1);
      absl::StatusOr<DataConnection::Answered> answered =
          c.PullCall(i + 1, r.SerializeAsString(), absl::MakeSpan(got[i]), WireType::kFloat32,
                     absl::Now() + absl::Seconds(30));
      answers[i] = answered.ok() ? answered->status
                                 : grpc::Status(grpc::StatusCode::UNKNOWN,
                                                std::string(answered.status().message()));
      refused += answers[i].error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    });
  }
  v1::StatsResponse stats;
  for (absl::Time end = Soon();
       (refused.load() < 1 || stats.pulls_waiting() < 4) && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(20));
    stats = Stats(sync.ShardAddress(0));
  }
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(stats.pulls_waiting(), 4);
  ASSERT_TRUE(worker1.Push(gradient, 0).ok());  // the round is complete: the held pulls answer
  for (std::thread& t : pulls) t.join();
  for (int i = 0; i < kPulls; ++i) {
    if (answers[i].error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_EQ(got[i][0], -1.0f);
      continue;
    }
    ASSERT_TRUE(answers[i].ok()) << i << ": " << answers[i].error_message();
    EXPECT_EQ(got[i][5], initial_[5] - 0.5f) << i;
  }
  EXPECT_EQ(Stats(sync.ShardAddress(0)).data_plane_pulls(), kPulls - 1);

  // A client that cancels its calls (as at SIGTERM) ends its pull held on the plane at once, not
  // at the attempt's deadline.
  options.data_plane = true;
  options.rpc_timeout = absl::Seconds(60);
  ShardedClient planed({sync.ShardAddress(0)}, kModel, 0, options);
  ASSERT_TRUE(planed.Register().ok());
  std::vector<float> weights(kParams);
  ASSERT_TRUE(planed.Pull(absl::MakeSpan(weights)).ok());
  ASSERT_TRUE(planed.Push(gradient, 1).ok());  // the next round waits for worker 1
  ShardedClient::Pending<ShardedClient::Versions> held = planed.StartPull(absl::MakeSpan(weights));
  EXPECT_FALSE(held.Done(absl::Milliseconds(300)));  // at the barrier
  const absl::Time cancelled = absl::Now();
  planed.CancelPending();
  EXPECT_TRUE(held.Done(absl::Seconds(20)));
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(20));
  EXPECT_FALSE(held.Wait().ok());
  // The shard lets that pull (and its place among --max_pulls) go with its connection, as it does
  // a gRPC pull whose call is cancelled, not at its deadline a minute later.
  for (absl::Time end = Soon();
       Stats(sync.ShardAddress(0)).pulls_waiting() > 0 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Stats(sync.ShardAddress(0)).pulls_waiting(), 0);
}

// A replicated shard: the primary makes its changes on the backup's data plane (a call each,
// answered once applied), or streams them when the backup has none; either way the backup that
// takes over holds the primary's weights bit for bit (momentum, clipped gradients). No one else
// makes a change on a data plane: a worker's connection that tries is refused, nothing applied.
TEST_F(DataPlaneShardTest, ChangesReachTheBackupOnItsDataPlaneOrTheStreamBitForBit) {
  for (const bool backup_plane : {true, false}) {
    SCOPED_TRACE(backup_plane ? "on the backup's data plane" : "on the replication stream");
    const std::string run_dir = NewRunDir("replicated");
    LocalCluster replicated(ExecutableDir(), run_dir);
    std::vector<std::string> flags = {"--optimizer=momentum", "--lr=0.1", "--clip_norm=50"};
    if (!backup_plane) flags.push_back("--data_plane_port=-1");
    ASSERT_TRUE(replicated.StartShards(1, kModel.fingerprint, 1, flags, /*replicas=*/2).ok());
    const std::string primary = replicated.ProcessAddress(0), backup = replicated.ProcessAddress(1);
    ASSERT_TRUE(WaitForRole(backup, "backup", absl::Seconds(30)));
    ClientOptions options;
    options.shared_memory = false;
    options.retry_for = absl::Seconds(30);
    ShardedClient client({replicated.ShardAddress(0)}, kModel, 0, options);
    ASSERT_TRUE(client.Register().ok());
    ASSERT_TRUE(client.Initialize(initial_).ok());
    std::vector<float> gradient(kParams);
    for (int step = 0; step < 4; ++step) {
      for (int i = 0; i < kParams; ++i) gradient[i] = std::sin(0.01f * i + step);  // norm ~387
      absl::StatusOr<ShardedClient::PushSummary> pushed = client.Push(gradient);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
    }
    std::vector<float> weights(kParams);
    ASSERT_TRUE(client.Pull(absl::MakeSpan(weights)).ok());
    const v1::StatsResponse before = Stats(primary);
    EXPECT_EQ(before.version(), 4);
    EXPECT_EQ(before.pushes_clipped(), 4);
    EXPECT_EQ(before.data_plane_pushes(), backup_plane ? 4 : 0);
    // The primary says where a backup that joined at change `change` gets the changes.
    auto expect_joined = [&](int change) {
      const std::string said = ReadFile(run_dir + "/ps-0-0.log");
      EXPECT_NE(said.find(absl::StrCat(
                    "a backup joined at change ", change, ": ",
                    backup_plane ? "making changes on its data plane" : "streaming changes")),
                std::string::npos)
          << said;
    };
    expect_joined(0);

    if (backup_plane) {  // a worker's connection to the primary making a change
      v1::AttachDataPlaneResponse ticket;
      ASSERT_TRUE(Attach(0, "", &ticket, primary).ok());
      absl::StatusOr<std::unique_ptr<DataConnection>> c = DataConnection::Open(
          {"127.0.0.1", ticket.port(), ticket.connection(), ticket.secret(), 1, true},
          kParams * sizeof(float), Soon(), absl::Seconds(10));
      ASSERT_TRUE(c.ok()) << c.status();
      v1::ReplicationMessage change;
      change.set_epoch(before.replica_epoch());
      v1::ChangeHeader* h = change.mutable_change();
      h->set_index(before.version() + 2);  // initialisation and 4 updates so far
      h->set_kind(v1::ChangeHeader::UPDATE);
      h->set_version(before.version() + 1);
      h->set_learning_rate(1);
      h->set_length(kParams);
      absl::StatusOr<DataConnection::Answered> answered =
          (*c)->PushCall(1, change.SerializeAsString(), gradient, WireType::kFloat32, Soon(),
                         FrameKind::kChangeCall);
      ASSERT_TRUE(answered.ok()) << answered.status();
      EXPECT_EQ(answered->status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << answered->status.error_message();
      EXPECT_EQ(Stats(primary).version(), 4);
    }

    // It followed on from the start without joining again.
    const std::string followed = ReadFile(run_dir + "/ps-0-1.log");
    const std::vector<absl::string_view> joins = absl::StrSplit(followed, "following the primary");
    EXPECT_EQ(joins.size(), 2u) << followed;
    // A backup restarted joins the trained shard (the state, then the changes on its data plane
    // or the stream) while pushes keep coming.
    replicated.shards()[1].Signal(SIGKILL);
    ASSERT_TRUE(replicated.shards()[1].Wait(absl::Seconds(10)).ok());
    ASSERT_TRUE(replicated.RestartShard(1).ok());
    for (int step = 4; step < 6; ++step) {
      for (int i = 0; i < kParams; ++i) gradient[i] = std::cos(0.01f * i + step);
      absl::StatusOr<ShardedClient::PushSummary> pushed = client.Push(gradient);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
    }
    ASSERT_TRUE(client.Pull(absl::MakeSpan(weights)).ok());
    expect_joined(5);

    // The backup takes over with what it was sent.
    replicated.shards()[0].Signal(SIGKILL);
    ASSERT_TRUE(replicated.shards()[0].Wait(absl::Seconds(10)).ok());
    std::vector<float> taken_over(kParams);
    ASSERT_TRUE(client.Pull(absl::MakeSpan(taken_over)).ok());
    EXPECT_EQ(Stats(backup).replica_role(), "primary");
    EXPECT_EQ(Stats(backup).version(), 6);
    EXPECT_EQ(std::memcmp(weights.data(), taken_over.data(), kParams * sizeof(float)), 0);
    replicated.Stop();
  }
}

// A push of 4 MiB or more goes on to the backup while it still comes in, as a stage its change
// then names (in one part, a push call on the connection; in two, striped over two lanes, the
// parts coming at once): the backup applies it bit for bit as the primary did, and as a primary
// that does not forward (--forward_pushes=false) has its backup apply it. A stage no change names
// (the push rejected, clipped or cut mid-tensor) is dropped on the backup, which follows on
// without joining again, and later pushes are forwarded again (the backup holds four at most).
TEST_F(DataPlaneShardTest, APushForwardedToTheBackupAsItComesIsAppliedThereBitForBit) {
  constexpr int kBig = 2200000;  // 8.8 MB: two parts over two lanes
  const ModelIdentity big{"flat:2200000", kBig, 1};
  std::vector<float> initial(kBig), gradient(kBig);
  for (int i = 0; i < kBig; ++i) initial[i] = 0.25f * (i % 100);
  std::vector<std::vector<float>> trained;
  struct Config {
    bool forward;
    int lanes;
  };
  for (const Config config : {Config{true, 1}, Config{true, 2}, Config{false, 1}}) {
    const bool forward = config.forward;
    SCOPED_TRACE(
        absl::StrCat(forward ? "forwarding" : "not forwarding", ", ", config.lanes, " lane(s)"));
    const std::string run_dir = NewRunDir("forward");
    LocalCluster replicated(ExecutableDir(), run_dir);
    StartReplicated(replicated, big.fingerprint,
                    {"--optimizer=momentum", "--lr=0.1", "--clip_norm=2000",
                     absl::StrCat("--forward_pushes=", forward),
                     absl::StrCat("--data_plane_lanes=", config.lanes)});
    const std::string primary = replicated.ProcessAddress(0), backup = replicated.ProcessAddress(1);
    const ClientOptions options = Remote();
    ShardedClient client({replicated.ShardAddress(0)}, big, 0, options);
    ASSERT_TRUE(client.Register().ok());
    ASSERT_TRUE(client.Initialize(initial).ok());
    // A gradient of norm ~1049 * scale: clipped (to 2000) when scale is 2.
    auto push = [&](int step, float scale) {
      for (int i = 0; i < kBig; ++i) gradient[i] = scale * std::sin(0.001f * i + step);
      return client.Push(gradient);
    };
    for (int step = 0; step < 3; ++step) ASSERT_TRUE(push(step, 1).ok());
    gradient[kBig - 1] = NAN;  // found once the whole tensor came: three rejected pushes
    for (int rejected = 0; rejected < 3; ++rejected) {
      absl::StatusOr<ShardedClient::PushSummary> refused = client.Push(gradient);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    }
    ASSERT_TRUE(push(3, 2).ok());  // clipped
    if (config.lanes == 1) {       // cut mid-tensor, on a raw connection of worker 1's
      ClientOptions grpc_only = options;
      grpc_only.data_plane = false;  // its own connection would replace the raw one
      ShardedClient worker1({primary}, big, 1, grpc_only);
      ASSERT_TRUE(worker1.Register().ok());
      v1::AttachDataPlaneResponse ticket;
      ASSERT_TRUE(Attach(1, "", &ticket, primary, big).ok());
      CutPushCall(ticket, worker1.incarnation(0), gradient);
      // Counted once its stage was padded out (so the next push finds none being sent).
      for (absl::Time end = Soon(); Stats(primary).pushes_rejected() < 4 && absl::Now() < end;) {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
    for (int step = 4; step < 6; ++step) ASSERT_TRUE(push(step, 1).ok());
    std::vector<float> weights(kBig);
    ASSERT_TRUE(client.Pull(absl::MakeSpan(weights)).ok());
    const v1::StatsResponse stats = Stats(primary);
    EXPECT_EQ(stats.version(), 6);
    EXPECT_EQ(stats.pushes_clipped(), 1);
    EXPECT_EQ(stats.pushes_rejected(), config.lanes == 1 ? 4 : 3);  // three not finite, one cut
    EXPECT_EQ(stats.data_plane_pushes(), 6);
    EXPECT_EQ(stats.replica_changes_forwarded(), forward ? 5 : 0);
    // The backup followed on from the start without joining again.
    const std::string followed = ReadFile(run_dir + "/ps-0-1.log");
    const std::vector<absl::string_view> joins = absl::StrSplit(followed, "following the primary");
    EXPECT_EQ(joins.size(), 2u) << followed;
    // It takes over with what it was sent.
    replicated.shards()[0].Signal(SIGKILL);
    ASSERT_TRUE(replicated.shards()[0].Wait(absl::Seconds(10)).ok());
    std::vector<float> taken_over(kBig);
    ASSERT_TRUE(client.Pull(absl::MakeSpan(taken_over)).ok());
    EXPECT_EQ(Stats(backup).replica_role(), "primary");
    EXPECT_EQ(Stats(backup).version(), 6);
    EXPECT_EQ(std::memcmp(weights.data(), taken_over.data(), kBig * sizeof(float)), 0);
    trained.push_back(std::move(weights));
    replicated.Stop();
  }
  ASSERT_EQ(trained.size(), 3u);
  for (int other : {1, 2}) {
    EXPECT_EQ(std::memcmp(trained[0].data(), trained[other].data(), kBig * sizeof(float)), 0);
  }
}

// A model of one shard whose pushes are forwarded (4.8 MB).
const ModelIdentity kForwarded{"flat:1200000", 1200000, 1};

// A push that comes slowly holds up no other push's replication: stages go to the backup on
// connections of their own (--forward_at_once of them, 2 by default), so other workers' pushes
// are forwarded, applied on both replicas and acknowledged while the slow ones are still coming,
// as many at once as there are connections (a push that finds none free is replicated once
// applied); the slow ones are then applied too, and both replicas agree.
TEST_F(DataPlaneShardTest, PushesComingSlowlyHoldUpNoOtherPushsReplication) {
  const int kBig = kForwarded.total_params;
  const ModelIdentity& big = kForwarded;
  struct Config {
    std::string flag;  // --forward_at_once, or "" for the default
    int slow;          // workers whose pushes come slowly, before worker 0's
    int forwarded;     // of the slow + 1 pushes
  };
  for (const Config& config : {Config{"", 1, 2}, Config{"--forward_at_once=1", 1, 1},
                               Config{"--forward_at_once=3", 2, 3}}) {
    SCOPED_TRACE(absl::StrCat(config.flag, " ", config.slow, " slow"));
    const std::string run_dir = NewRunDir("slow-forward");
    LocalCluster replicated(ExecutableDir(), run_dir);
    std::vector<std::string> flags = {"--optimizer=sgd", "--lr=0.1", "--data_plane_lanes=1"};
    if (!config.flag.empty()) flags.push_back(config.flag);
    StartReplicated(replicated, big.fingerprint, flags, /*workers=*/config.slow + 1);
    if (HasFatalFailure()) return;
    const std::string primary = replicated.ProcessAddress(0), backup = replicated.ProcessAddress(1);
    ShardedClient fast({replicated.ShardAddress(0)}, big, 0, Remote());
    ASSERT_TRUE(fast.Register().ok());
    ASSERT_TRUE(fast.Initialize(std::vector<float>(kBig, 0.5f)).ok());
    // Workers 1.. push on connections of their own, half of their tensors and then nothing for
    // now; each push's stage is being sent (or not: no connection free) before the next starts.
    const std::vector<float> slow_gradient(kBig, 0.25f);
    std::vector<RawWorker> slow(config.slow);
    for (int w = 0; w < config.slow; ++w) {
      OpenRawWorker(w + 1, primary, big, &slow[w]);
      if (HasFatalFailure()) return;
    }
    std::vector<std::unique_ptr<FillProgress>> coming;  // made before any thread reads one
    for (int w = 0; w < config.slow; ++w) coming.push_back(std::make_unique<FillProgress>(kBig));
    std::vector<absl::StatusOr<DataConnection::Answered>> answers(
        config.slow, absl::UnknownError("not answered"));
    std::vector<std::thread> threads;
    for (int w = 0; w < config.slow; ++w) {
      threads.emplace_back([&, w] {
        answers[w] = slow[w].connection->PushCall(
            1, slow[w].header.SerializeAsString(), slow_gradient, WireType::kFloat32,
            absl::Now() + absl::Seconds(60), FrameKind::kPushCall, coming[w].get());
      });
      coming[w]->Add(kBig / 2);
      const int sending = std::min(w + 1, config.forwarded);
      for (absl::Time end = Soon();
           Stats(primary).replica_stages_sending() < sending && absl::Now() < end;) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      EXPECT_EQ(Stats(primary).replica_stages_sending(), sending);
    }
    // Worker 0's push is acknowledged (on both replicas) meanwhile.
    absl::StatusOr<ShardedClient::PushSummary> pushed = fast.Push(std::vector<float>(kBig, 1.0f));
    EXPECT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_EQ(Stats(primary).version(), 1);
    for (const auto& c : coming) c->Add(kBig);  // the rest
    for (std::thread& t : threads) t.join();
    for (const auto& answer : answers) {
      ASSERT_TRUE(answer.ok()) << answer.status();
      EXPECT_TRUE(answer->status.ok()) << answer->status.error_message();
    }
    std::vector<float> weights(kBig), taken_over(kBig);
    ASSERT_TRUE(fast.Pull(absl::MakeSpan(weights)).ok());
    EXPECT_FLOAT_EQ(weights[7], 0.5f - 0.1f * (1.0f + 0.25f * config.slow));
    const v1::StatsResponse stats = Stats(primary);
    EXPECT_EQ(stats.version(), 1 + config.slow);
    EXPECT_EQ(stats.replica_changes_forwarded(), config.forwarded);
    EXPECT_EQ(stats.replica_stages_sending(), 0);
    // The backup followed on from the start without joining again.
    const std::string followed = ReadFile(run_dir + "/ps-0-1.log");
    const std::vector<absl::string_view> joins = absl::StrSplit(followed, "following the primary");
    EXPECT_EQ(joins.size(), 2u) << followed;
    replicated.shards()[0].Signal(SIGKILL);
    ASSERT_TRUE(replicated.shards()[0].Wait(absl::Seconds(10)).ok());
    ASSERT_TRUE(fast.Pull(absl::MakeSpan(taken_over)).ok());
    EXPECT_EQ(Stats(backup).version(), 1 + config.slow);
    EXPECT_EQ(std::memcmp(weights.data(), taken_over.data(), kBig * sizeof(float)), 0);
    replicated.Stop();
  }
}

// A push whose worker stalls mid-tensor fails once the data plane's stall passed, and its stage
// is padded out and dropped on the backup, not failed: forwarding goes on for the next pushes
// without the backup joining again.
TEST_F(DataPlaneShardTest, APushWhoseWorkerStallsLeavesForwardingOn) {
  const int kBig = kForwarded.total_params;
  const ModelIdentity& big = kForwarded;
  const std::string run_dir = NewRunDir("stalled-forward");
  LocalCluster replicated(ExecutableDir(), run_dir);
  // Worker 0 sends no heartbeat while worker 1 stalls: a lease that outlasts the stall keeps its
  // connection (an expired lease frees it).
  StartReplicated(replicated, big.fingerprint,
                  {"--optimizer=sgd", "--lr=0.1", "--data_plane_lanes=1", "--lease_seconds=600"});
  const std::string primary = replicated.ProcessAddress(0);
  ShardedClient worker0({replicated.ShardAddress(0)}, big, 0, Remote());
  ASSERT_TRUE(worker0.Register().ok());
  ASSERT_TRUE(worker0.Initialize(std::vector<float>(kBig, 0.5f)).ok());
  RawWorker w1;
  OpenRawWorker(1, primary, big, &w1);
  if (HasFatalFailure()) return;
  const std::vector<float> gradient(kBig, 0.25f);
  FillProgress coming(kBig);
  coming.Add(kBig / 2);  // and nothing more until the shard gave up on it
  std::thread stalled([&] {
    w1.connection
        ->PushCall(1, w1.header.SerializeAsString(), gradient, WireType::kFloat32,
                   absl::Now() + absl::Seconds(120), FrameKind::kPushCall, &coming)
        .IgnoreError();
  });
  for (absl::Time end = absl::Now() + absl::Seconds(60);
       Stats(primary).pushes_rejected() < 1 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  coming.Add(kBig / 2);  // the rest, to a connection the shard closed
  stalled.join();
  EXPECT_EQ(Stats(primary).pushes_rejected(), 1);
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(worker0.Push(std::vector<float>(kBig, 1.0f)).ok());
  }
  const v1::StatsResponse stats = Stats(primary);
  EXPECT_EQ(stats.version(), 2);
  EXPECT_EQ(stats.replica_changes_forwarded(), 2);
  const std::string followed = ReadFile(run_dir + "/ps-0-1.log");
  const std::vector<absl::string_view> joins = absl::StrSplit(followed, "following the primary");
  EXPECT_EQ(joins.size(), 2u) << followed;
  replicated.Stop();
}

// A shard whose clients open three lanes: its 13 MB tensors go in three parts, with the same
// results as over gRPC.
// A held push told how far a backward pass has filled its gradient in (Pending::Filled) sends its
// part as a data-plane call, last piece first, before the rest is final, and is applied as the
// whole gradient pushed at once is. Cancelled while its values are still coming, it ends
// CANCELLED at once, nothing applied, and the next push goes as usual.
TEST_F(DataPlaneShardTest, APushFilledFromItsEndIsAppliedAsTheWholeGradientOrNotAtAll) {
  std::vector<float> weights(kParams);
  ASSERT_TRUE(worker0_->Pull(absl::MakeSpan(weights)).ok());  // its data-plane connection opens
  std::vector<float> gradient(kParams, std::nanf(""));        // what backward has not written yet
  ShardedClient::Pending<ShardedClient::PushSummary> push =
      worker0_->StartPush(gradient, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
  for (int from : {kParams - 1000, kParams / 2, 1000, 0}) {  // backward's layers, the last first
    for (int i = from; i < kParams && std::isnan(gradient[i]); ++i) gradient[i] = 0.001f * (i % 7);
    push.Filled(from);
  }
  absl::StatusOr<ShardedClient::PushSummary> pushed = push.Wait();
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->max_staleness, 0);
  ASSERT_TRUE(worker0_->Pull(absl::MakeSpan(weights)).ok());
  for (int i = 0; i < kParams; ++i) {
    ASSERT_EQ(weights[i], initial_[i] - 0.5f * gradient[i]) << i;  // SGD, lr 0.5, bit for bit
  }
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.version(), 1);
  EXPECT_EQ(stats.pushes_rejected(), 0);
  EXPECT_EQ(stats.data_plane_pushes(), 1);

  // Dropped midway (backward failed: the Pending destroyed unwaited): at once, nothing applied,
  // and the next push still goes over the data plane.
  absl::Time start = absl::Now();
  {
    std::fill(gradient.begin(), gradient.end(), std::nanf(""));
    ShardedClient::Pending<ShardedClient::PushSummary> dropped =
        worker0_->StartPush(gradient, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
    std::fill(gradient.begin() + kParams / 2, gradient.end(), 0.5f);
    dropped.Filled(kParams / 2);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the dropped part was retried";
  stats = ShardStats();
  EXPECT_EQ(stats.version(), 1);
  ASSERT_TRUE(worker0_->Pull(absl::MakeSpan(weights)).ok());
  std::fill(gradient.begin(), gradient.end(), 0.0f);
  ASSERT_TRUE(worker0_->Push(gradient).ok());
  EXPECT_EQ(ShardStats().data_plane_pushes(), stats.data_plane_pushes() + 1);

  // Its connection replaced (as by a newer one of this worker's) while the values come, or before
  // they start: the part goes again once all of them are in, over gRPC, applied once and whole.
  ASSERT_TRUE(worker0_->Pull(absl::MakeSpan(weights)).ok());
  std::fill(gradient.begin(), gradient.end(), std::nanf(""));
  push = worker0_->StartPush(gradient, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
  for (int i = kParams / 2; i < kParams; ++i) gradient[i] = 0.002f * (i % 5);
  push.Filled(kParams / 2);
  v1::AttachDataPlaneResponse ticket;
  Socket newer;
  OpenRawConnection(0, &ticket, &newer);
  if (HasFatalFailure()) return;
  for (int i = 0; i < kParams / 2; ++i) gradient[i] = 0.002f * (i % 5);
  push.Filled(0);
  pushed = push.Wait();
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->duplicates, 0);
  const std::vector<float> before = weights;
  ASSERT_TRUE(worker0_->Pull(absl::MakeSpan(weights)).ok());
  for (int i = 0; i < kParams; ++i) ASSERT_EQ(weights[i], before[i] - 0.5f * gradient[i]) << i;
  EXPECT_EQ(ShardStats().version(), 3);

  std::fill(gradient.begin(), gradient.end(), std::nanf(""));
  push = worker0_->StartPush(gradient, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
  std::fill(gradient.begin() + kParams / 2, gradient.end(), 0.5f);
  push.Filled(kParams / 2);
  start = absl::Now();
  worker0_->CancelPending();
  absl::StatusOr<ShardedClient::PushSummary> cancelled = push.Wait();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "it waited for values to come";
  EXPECT_EQ(ShardStats().version(), 3);
  std::fill(gradient.begin(), gradient.end(), 0.5f);
  pushed = worker0_->Push(gradient);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(ShardStats().version(), 4);
}

// A push sent as backward makes it takes what backward takes: here longer than the client's
// attempts and its whole retry budget, its pieces each within the shard's stall. It is applied
// once, whole, over the data plane. Its retries count from the end of backward, as a part sent
// once final does: a shard that stops as the last piece goes is waited for that long.
TEST_F(DataPlaneShardTest, APushSentAsBackwardMakesItMayTakeLongerThanAnAttempt) {
  ClientOptions hasty = Remote();
  hasty.security.token = token_;
  hasty.rpc_timeout = absl::Seconds(1);
  hasty.retry_for = absl::Seconds(3);
  ShardedClient worker1({cluster_->ShardAddress(0)}, kModel, 1, hasty);
  ASSERT_TRUE(worker1.Register().ok());
  std::vector<float> weights(kParams);
  const int64_t pushes = ShardStats().data_plane_pushes();
  std::vector<float> gradient(kParams);
  Subprocess& shard = cluster_->shards()[0];
  for (bool stopped : {false, true}) {
    SCOPED_TRACE(stopped ? "the shard stopped as the last piece goes" : "");
    ASSERT_TRUE(worker1.Pull(absl::MakeSpan(weights)).ok());
    std::fill(gradient.begin(), gradient.end(), std::nanf(""));
    ShardedClient::Pending<ShardedClient::PushSummary> push =
        worker1.StartPush(gradient, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
    // Two pieces (256K values each at most): the last goes now, the first 4 s later.
    for (int i = int{kFillPiece}; i < kParams; ++i) gradient[i] = 0.25f;
    push.Filled(kFillPiece);
    absl::SleepFor(absl::Seconds(4));
    for (int i = 0; i < kFillPiece; ++i) gradient[i] = 0.5f;
    std::thread resume;
    if (stopped) {
      shard.Signal(SIGSTOP);
      resume = std::thread([&] {
        absl::SleepFor(absl::Milliseconds(1500));
        shard.Signal(SIGCONT);
      });
    }
    push.Filled(0);
    absl::StatusOr<ShardedClient::PushSummary> pushed = push.Wait();
    if (resume.joinable()) resume.join();
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    const std::vector<float> before = weights;
    ASSERT_TRUE(worker1.Pull(absl::MakeSpan(weights)).ok());
    for (int i = 0; i < kParams; ++i) ASSERT_EQ(weights[i], before[i] - 0.5f * gradient[i]) << i;
    if (!stopped) {
      EXPECT_EQ(ShardStats().data_plane_pushes(), pushes + 1);
    }
  }
  EXPECT_EQ(ShardStats().version(), 2);  // each push applied once
}

// A push whose values come last piece first is a float32 call on the data plane: over gRPC, or
// as bf16, it is refused, saying why, and nothing is applied.
TEST_F(DataPlaneShardTest, APushLastPieceFirstIsRefusedWhereItCannotBeRead) {
  std::unique_ptr<ShardedClient> worker1 = Client(1, /*data_plane=*/false);
  ASSERT_TRUE(worker1->Register().ok());
  v1::AttachDataPlaneResponse ticket;
  ASSERT_TRUE(Attach(1, token_, &ticket).ok());
  EXPECT_TRUE(ticket.last_piece_first());
  absl::StatusOr<std::unique_ptr<DataConnection>> c = DataConnection::Open(
      {"127.0.0.1", ticket.port(), ticket.connection(), ticket.secret(), 1, true},
      kParams * sizeof(float), Soon(), absl::Seconds(10));
  ASSERT_TRUE(c.ok()) << c.status();
  v1::PushHeader h = RawPushCall(1, worker1->incarnation(0), kParams, (*c)->id());
  h.mutable_path()->set_last_piece_first(true);
  h.set_dtype(v1::BFLOAT16);
  const std::vector<float> gradient(kParams, 1.0f);
  absl::StatusOr<DataConnection::Answered> answered =
      (*c)->PushCall(1, h.SerializeAsString(), gradient, WireType::kBFloat16, Soon());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(answered->status.error_message().find("last piece first"), std::string::npos)
      << answered->status.error_message();

  grpc::ClientContext context;
  v1::PushResponse response;
  auto writer = RawGrpcPush(&context, &response);
  v1::PushChunk chunk;
  *chunk.mutable_header() = RawPushCall(1, worker1->incarnation(0), kParams, 0);
  chunk.mutable_header()->mutable_path()->set_last_piece_first(true);
  chunk.mutable_header()->mutable_path()->set_data_transfer(0);
  writer->Write(chunk);
  writer->WritesDone();
  grpc::Status refused = writer->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("data plane"), std::string::npos)
      << refused.error_message();
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.version(), 0);
  EXPECT_EQ(stats.pushes_rejected(), 2);
}

TEST_F(DataPlaneShardTest, TensorsStripedOverSeveralLanesGiveTheSameResults) {
  constexpr int kBig = 3300000;
  const ModelIdentity big{"flat:3300000", kBig, 1};
  ASSERT_EQ(StripeCount(kBig, WireType::kFloat32, 3), 3);
  LocalCluster striped(ExecutableDir(), dir_ + "/striped");
  ASSERT_TRUE(striped
                  .StartShards(1, big.fingerprint, 2,
                               {"--optimizer=sgd", "--lr=0.5", "--data_plane_lanes=3"})
                  .ok());
  ClientOptions options;
  options.shared_memory = false;
  options.retry_for = absl::Seconds(20);
  ShardedClient over_plane({striped.ShardAddress(0)}, big, 0, options);
  options.data_plane = false;
  ShardedClient over_grpc({striped.ShardAddress(0)}, big, 1, options);
  ASSERT_TRUE(over_plane.Register().ok());
  ASSERT_TRUE(over_grpc.Register().ok());
  std::vector<float> initial(kBig), gradient(kBig);
  for (int i = 0; i < kBig; ++i) {
    initial[i] = 0.25f * (i % 100);
    gradient[i] = 0.001f * (i % 7);
  }
  ASSERT_TRUE(over_plane.Initialize(initial).ok());
  ExpectStepsInTurnAgree(over_plane, over_grpc, initial, gradient, 0.5f);
  if (HasFatalFailure()) return;
  v1::StatsResponse stats = Stats(striped.ShardAddress(0));
  EXPECT_EQ(stats.data_plane_pushes(), 2);
  EXPECT_EQ(stats.data_plane_pulls(), 3);
  EXPECT_EQ(stats.data_plane_connections(), 1);
}

// A process of worker 1's that a newer one superseded (it registered again) cannot take the
// newer one's tensor paths: its data-plane ticket and its shared-memory segment are refused.
TEST_F(DataPlaneShardTest, ASupersededProcessOfAWorkerGetsNoTensorPath) {
  std::unique_ptr<ShardedClient> older = Client(1, /*data_plane=*/false);
  ASSERT_TRUE(older->Register().ok());
  std::unique_ptr<ShardedClient> newer = Client(1, /*data_plane=*/false);
  ASSERT_TRUE(newer->Register().ok());
  ASSERT_NE(older->incarnation(0), newer->incarnation(0));
  v1::AttachDataPlaneResponse ticket;
  grpc::Status refused = RawAttachDataPlane(cluster_->ShardAddress(0), 1, kModel, token_, &ticket,
                                            older->incarnation(0));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_NE(refused.error_message().find("superseded"), std::string::npos)
      << refused.error_message();
  EXPECT_TRUE(RawAttachDataPlane(cluster_->ShardAddress(0), 1, kModel, token_, &ticket,
                                 newer->incarnation(0))
                  .ok());
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(cluster_->ShardAddress(0), grpc::InsecureChannelCredentials()));
  for (const int64_t incarnation : {older->incarnation(0), newer->incarnation(0)}) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    context.AddMetadata("authorization", "Bearer " + token_);
    v1::AttachSharedMemoryRequest request;
    request.set_worker_id(1);
    request.mutable_model()->set_fingerprint(kModel.fingerprint);
    request.mutable_model()->set_total_params(kModel.total_params);
    request.mutable_model()->set_num_shards(kModel.num_shards);
    request.set_process_space(ProcessSpaceId());
    request.set_incarnation(incarnation);
    v1::AttachSharedMemoryResponse segment;
    grpc::Status attached = stub->AttachSharedMemory(&context, request, &segment);
    if (incarnation == older->incarnation(0)) {
      EXPECT_EQ(attached.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
          << attached.error_message();
    } else {
      EXPECT_TRUE(attached.ok()) << attached.error_message();
    }
  }
}

TEST_F(DataPlaneShardTest, AShardWithoutADataPlaneIsUsedOverGrpc) {
  LocalCluster plain(ExecutableDir(), dir_ + "/plain");
  ASSERT_TRUE(plain.StartShards(1, kModel.fingerprint, 1, {"--data_plane_port=-1"}).ok());
  ClientOptions options;
  options.shared_memory = false;
  ShardedClient client({plain.ShardAddress(0)}, kModel, 0, options);
  ASSERT_TRUE(client.Register().ok());
  ASSERT_TRUE(client.Initialize(initial_).ok());
  std::vector<float> got(kParams);
  ASSERT_TRUE(client.Pull(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, initial_);
  ASSERT_TRUE(client.Push(std::vector<float>(kParams, 0.5f)).ok());
  v1::StatsResponse stats = Stats(plain.ShardAddress(0));
  EXPECT_EQ(stats.pushes_applied(), 1);
  EXPECT_EQ(stats.data_plane_pushes(), 0);
  EXPECT_EQ(stats.data_plane_connections(), 0);
}

// A pull's values serve as they arrive, over the data plane and over gRPC's stream: its first
// values are in (and usable) while the rest of the same shard's part is held up behind its
// stopped shard. Values used so are never rewritten: when the attempt that brought them fails,
// the pull ends ABORTED rather than being retried; one whose values were not used is retried.
TEST(PullValuesTest, TheFirstServeWhileTheRestComeAndUsedOnesAreNeverRewrittenByARetry) {
  // 128 MiB: several times what the sockets and HTTP/2 windows between shard and client hold.
  constexpr int64_t kBig = int64_t{1} << 25;
  constexpr int64_t kFirst = 1000;
  const ModelIdentity model{absl::StrCat("flat:", kBig), kBig, 1};
  LocalCluster cluster(ExecutableDir(), NewRunDir("pull-values"));
  ASSERT_TRUE(cluster.StartShards(1, model.fingerprint, 4, {"--optimizer=sgd"}).ok());
  Subprocess& shard = cluster.shards()[0];
  std::vector<float> initial(kBig);
  for (int64_t i = 0; i < kBig; ++i) initial[i] = static_cast<float>(i % 1000);
  std::vector<float> got(kBig);
  for (bool data_plane : {true, false}) {
    SCOPED_TRACE(data_plane ? "data plane" : "gRPC");
    ClientOptions options = Remote();
    options.data_plane = data_plane;
    // A patient client, whose attempts outlast the shard's stop, and a hasty one, whose do not.
    options.rpc_timeout = absl::Seconds(30);
    ShardedClient patient({cluster.ShardAddress(0)}, model, data_plane ? 0 : 1, options);
    options.rpc_timeout = absl::Seconds(3);
    ShardedClient hasty({cluster.ShardAddress(0)}, model, data_plane ? 2 : 3, options);
    ASSERT_TRUE(patient.Register().ok());
    ASSERT_TRUE(hasty.Register().ok());
    if (data_plane) {
      ASSERT_TRUE(patient.Initialize(initial).ok());
    }

    std::fill(got.begin(), got.end(), -1.0f);
    ShardedClient::Pending<ShardedClient::Versions> pull = patient.StartPull(absl::MakeSpan(got));
    ASSERT_TRUE(pull.WaitValues(0, kFirst).ok());
    shard.Signal(SIGSTOP);
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + kFirst, initial.begin()));
    EXPECT_FALSE(pull.WaitValues(0, kBig, absl::Seconds(1)).has_value());
    EXPECT_FALSE(pull.Done(absl::ZeroDuration()));
    EXPECT_EQ(pull.WaitValues(0, kBig + 1, absl::ZeroDuration())->code(),
              absl::StatusCode::kInvalidArgument);
    shard.Signal(SIGCONT);
    ASSERT_TRUE(pull.Wait().ok());
    EXPECT_EQ(got, initial);

    // The same, but the shard stays stopped past the attempt's deadline.
    std::fill(got.begin(), got.end(), -1.0f);
    pull = hasty.StartPull(absl::MakeSpan(got));
    ASSERT_TRUE(pull.WaitValues(0, kFirst).ok());
    shard.Signal(SIGSTOP);
    absl::SleepFor(absl::Seconds(4));
    shard.Signal(SIGCONT);
    absl::StatusOr<ShardedClient::Versions> aborted = pull.Wait();
    EXPECT_EQ(aborted.status().code(), absl::StatusCode::kAborted) << aborted.status();
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + kFirst, initial.begin()));

    // Nothing used: the part that failed at its deadline is tried again, and the pull succeeds.
    std::fill(got.begin(), got.end(), -1.0f);
    pull = hasty.StartPull(absl::MakeSpan(got));
    shard.Signal(SIGSTOP);
    absl::SleepFor(absl::Seconds(4));
    shard.Signal(SIGCONT);
    ASSERT_TRUE(pull.Wait().ok());
    EXPECT_EQ(got, initial);
  }
}

// A pull started to be used as it arrives, where hosts hold several shards (listed "a:p0", "b:p1",
// "a:p2", "b:p3": the flat vector's parts spread over the hosts), takes each host's parts one after
// another in the list's order: with host a's first shard stopped, host b's two parts come in and
// a's second waits. On 127.0.0.1 (a local cluster: no link between shards) every part goes at once,
// and so do a prefetch's.
TEST(PullOrderTest, EachHostsPartsComeOneAfterAnotherInTheListsOrder) {
  constexpr int64_t kN = int64_t{1} << 22;  // 4 MiB a part
  const ModelIdentity model{absl::StrCat("flat:", kN), kN, 4};
  LocalCluster cluster(ExecutableDir(), NewRunDir("pull-order"));
  // Listening on every address, so that 127.0.0.2 and 127.0.0.3 stand for two hosts.
  ASSERT_TRUE(
      cluster
          .StartShards(4, model.fingerprint, 2, {"--optimizer=sgd", "--host=0.0.0.0", "--insecure"})
          .ok());
  std::vector<std::string> spread_out, local;
  for (int s = 0; s < 4; ++s) {
    const std::string address = cluster.ShardAddress(s);
    spread_out.push_back(
        absl::StrCat(s % 2 == 0 ? "127.0.0.2" : "127.0.0.3", address.substr(address.rfind(':'))));
    local.push_back(address);
  }
  std::vector<float> initial(kN);
  for (int64_t i = 0; i < kN; ++i) initial[i] = static_cast<float>(i % 1000);
  ShardedClient spread(spread_out, model, 0, Remote());
  ShardedClient here(local, model, 1, Remote());
  absl::StatusOr<int64_t> registered = spread.Register();
  ASSERT_TRUE(registered.ok()) << registered.status();
  ASSERT_TRUE(here.Register().ok());
  ASSERT_TRUE(spread.Initialize(initial).ok());
  std::vector<float> got(kN);
  for (ShardedClient* client : {&spread, &here}) {
    SCOPED_TRACE(client == &spread ? "two hosts" : "127.0.0.1");
    std::fill(got.begin(), got.end(), -1.0f);
    cluster.shards()[0].Signal(SIGSTOP);
    ShardedClient::Pending<ShardedClient::Versions> pull = client->StartPull(absl::MakeSpan(got));
    for (int s : {1, 3}) {
      const Range r = client->shard_range(s);
      ASSERT_TRUE(pull.WaitValues(r.begin, r.end).ok()) << "shard " << s;
    }
    const Range second = client->shard_range(2);
    std::optional<absl::Status> seen =
        pull.WaitValues(second.begin, second.end, absl::Seconds(client == &spread ? 3 : 60));
    if (client == &spread) {
      EXPECT_FALSE(seen.has_value()) << "host a's second part came while its first was held up";
    } else {
      EXPECT_TRUE(seen.has_value() && seen->ok());
    }
    cluster.shards()[0].Signal(SIGCONT);
    ASSERT_TRUE(pull.Wait().ok());
    EXPECT_EQ(got, initial);
  }

  // A prefetch runs while this step's push goes out on the same links: its parts all go at once.
  std::fill(got.begin(), got.end(), -1.0f);
  cluster.shards()[0].Signal(SIGSTOP);
  ShardedClient::Pending<ShardedClient::Versions> prefetch =
      spread.StartPull(absl::MakeSpan(got), /*prefetch=*/true);
  const Range second = spread.shard_range(2);
  // Within the client's 30 s retry budget, after which shard 0's part would fail and free the next.
  std::optional<absl::Status> in = prefetch.WaitValues(second.begin, second.end, absl::Seconds(15));
  EXPECT_TRUE(in.has_value() && in->ok()) << "host a's second part waited for its first";
  cluster.shards()[0].Signal(SIGCONT);
  ASSERT_TRUE(prefetch.Wait().ok());
  EXPECT_EQ(got, initial);
}

// A job with mutual TLS and a token keeps both on the data plane: its remote clients' tensors go
// there (encrypted) with the same results as over gRPC, and a replicated shard's primary makes its
// changes on its backup's plane, which takes over with the same weights.
TEST(DataPlaneTlsTest, AJobWithTlsMovesItsTensorsAndChangesOverThePlane) {
  const std::string dir = NewRunDir("data-plane-tls");
  ASSERT_TRUE(MakeTestCertificates(dir + "/certs"));
  auto pem = [&](const std::string& name) { return dir + "/certs/" + name; };
  std::ofstream(dir + "/token") << "sesame";
  ClusterSecurity security = ClusterSecurity::MutualTls(dir + "/certs");
  security.token_file = dir + "/token";
  absl::StatusOr<ClientSecurity> credentials =
      LoadClientSecurity({pem("client.pem"), pem("client.key"), pem("ca.pem")}, dir + "/token");
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  ClientOptions options;
  options.shared_memory = false;
  options.retry_for = absl::Seconds(30);
  options.security = *credentials;
  std::vector<float> initial(kParams), gradient(kParams);
  for (int i = 0; i < kParams; ++i) {
    initial[i] = 0.25f * (i % 100);
    gradient[i] = 0.001f * (i % 7);
  }

  LocalCluster alone(ExecutableDir(), dir + "/alone", security);
  ASSERT_TRUE(alone.StartShards(1, kModel.fingerprint, 2, {"--optimizer=sgd", "--lr=0.5"}).ok());
  ShardedClient over_plane({alone.ShardAddress(0)}, kModel, 0, options);
  options.data_plane = false;
  ShardedClient over_grpc({alone.ShardAddress(0)}, kModel, 1, options);
  options.data_plane = true;
  ASSERT_TRUE(over_plane.Register().ok());
  ASSERT_TRUE(over_grpc.Register().ok());
  ASSERT_TRUE(over_plane.Initialize(initial).ok());
  ExpectStepsInTurnAgree(over_plane, over_grpc, initial, gradient, 0.5f);
  if (HasFatalFailure()) return;
  absl::StatusOr<v1::StatsResponse> stats = alone.ProcessStats(0, absl::Seconds(10));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->data_plane_pushes(), 2);
  EXPECT_EQ(stats->data_plane_pulls(), 3);
  EXPECT_EQ(stats->data_plane_connections(), 1);
  alone.Stop();

  LocalCluster replicated(ExecutableDir(), dir + "/replicated", security);
  ASSERT_TRUE(replicated
                  .StartShards(1, kModel.fingerprint, 1, {"--optimizer=momentum", "--lr=0.1"},
                               /*replicas=*/2)
                  .ok());
  for (absl::Time end = absl::Now() + absl::Seconds(30);; absl::SleepFor(absl::Milliseconds(50))) {
    stats = replicated.ProcessStats(1, absl::Seconds(5));
    if (stats.ok() && stats->replica_role() == "backup") break;
    ASSERT_LT(absl::Now(), end) << "the backup did not join";
  }
  ShardedClient client({replicated.ShardAddress(0)}, kModel, 0, options);
  ASSERT_TRUE(client.Register().ok());
  ASSERT_TRUE(client.Initialize(initial).ok());
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(client.Push(gradient).ok());
  std::vector<float> weights(kParams), taken_over(kParams);
  ASSERT_TRUE(client.Pull(absl::MakeSpan(weights)).ok());
  const std::string said = ReadFile(dir + "/replicated/ps-0-0.log");
  EXPECT_NE(said.find("making changes on its data plane"), std::string::npos) << said;
  stats = replicated.ProcessStats(0, absl::Seconds(10));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->data_plane_pushes(), 3);
  stats = replicated.ProcessStats(1, absl::Seconds(10));
  ASSERT_TRUE(stats.ok()) << stats.status();
  // Its primary's: one for changes, and --forward_at_once's (2) for stages.
  EXPECT_EQ(stats->data_plane_connections(), 1 + Replica::Options().forward_at_once);
  replicated.shards()[0].Signal(SIGKILL);
  ASSERT_TRUE(replicated.shards()[0].Wait(absl::Seconds(10)).ok());
  ASSERT_TRUE(client.Pull(absl::MakeSpan(taken_over)).ok());
  stats = replicated.ProcessStats(1, absl::Seconds(10));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->replica_role(), "primary");
  EXPECT_EQ(stats->version(), 3);
  EXPECT_EQ(std::memcmp(weights.data(), taken_over.data(), kParams * sizeof(float)), 0);
  replicated.Stop();
}

}  // namespace
}  // namespace ps
