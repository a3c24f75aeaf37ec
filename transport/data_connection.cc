#include "transport/data_connection.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/data_frames.h"

namespace ps {
namespace {

// The shard's answer to a lane's hello: OK for Welcome, else UNAVAILABLE saying why.
absl::Status Welcomed(Socket& socket, const std::string& where, absl::Time deadline) {
  absl::StatusOr<FrameHeader> answer = ReceiveHeader(socket, deadline);
  if (!answer.ok()) {
    return absl::UnavailableError(
        absl::StrCat("data-plane hello to ", where, ": ", answer.status().message()));
  }
  if (answer->kind == FrameKind::kRefused && answer->bytes <= kMaxRefusalBytes) {
    std::string why(answer->bytes, '\0');
    absl::Status s = socket.Receive(why.data(), why.size(), deadline);
    return absl::UnavailableError(absl::StrCat("the shard refused the data-plane connection: ",
                                               s.ok() ? why : std::string(s.message())));
  }
  if (answer->kind != FrameKind::kWelcome || answer->bytes != 0) {
    return absl::UnavailableError("the shard answered the data-plane hello with another frame");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataConnection>> DataConnection::Open(const Ticket& ticket,
                                                                     uint64_t max_bytes,
                                                                     absl::Time deadline,
                                                                     absl::Duration stall) {
  if (ticket.lanes < 1 || ticket.lanes > kMaxLanes) {
    return absl::UnavailableError(
        absl::StrCat("the shard's data-plane ticket has ", ticket.lanes, " lanes"));
  }
  const std::string where = absl::StrCat(ticket.host, ":", ticket.port);
  std::vector<Socket> sockets;
  for (int lane = 0; lane < ticket.lanes; ++lane) {  // every hello first, then the answers
    absl::StatusOr<Socket> socket = Socket::Connect(ticket.host, ticket.port, deadline, stall);
    if (!socket.ok()) return socket.status();
    if (ticket.tls != nullptr) {
      if (absl::Status s = socket->Secure(*ticket.tls, ticket.host, deadline); !s.ok()) {
        return absl::UnavailableError(absl::StrCat("data plane at ", where, ": ", s.message()));
      }
    }
    if (absl::Status s = SendFrame(*socket, {FrameKind::kHello, ticket.connection},
                                   HelloPayload(ticket.secret, lane), deadline);
        !s.ok()) {
      return absl::UnavailableError(absl::StrCat("data-plane hello to ", where, ": ", s.message()));
    }
    sockets.push_back(*std::move(socket));
  }
  for (Socket& socket : sockets) {
    if (absl::Status s = Welcomed(socket, where, deadline); !s.ok()) return s;
  }
  return std::unique_ptr<DataConnection>(
      new DataConnection(std::move(sockets), ticket.connection, max_bytes, ticket.calls,
                         ticket.calls && ticket.last_piece_first));
}

DataConnection::DataConnection(std::vector<Socket> sockets, uint64_t id, uint64_t max_bytes,
                               bool calls, bool last_piece_first)
    : id_(id), calls_(calls), last_piece_first_(last_piece_first) {
  for (Socket& socket : sockets) {
    lanes_.push_back(std::make_unique<Lane>(std::move(socket), max_bytes));
    inboxes_.push_back(&lanes_.back()->inbox);
  }
  for (auto& lane : lanes_) {
    lane->reader = std::thread([l = lane.get()] { l->inbox.ReadLoop().IgnoreError(); });
  }
}

DataConnection::~DataConnection() {
  End();
  for (auto& lane : lanes_) lane->reader.join();
}

void DataConnection::End() {
  for (auto& lane : lanes_) lane->inbox.End();
}

bool DataConnection::ended() const {
  for (const auto& lane : lanes_) {
    if (lane->inbox.ended()) return true;
  }
  return false;
}

absl::StatusOr<int64_t> DataConnection::SendOtherParts(uint64_t transfer,
                                                       absl::Span<const float> values,
                                                       WireType type, int parts,
                                                       absl::Time deadline) {
  absl::StatusOr<bool> let_in = lanes_.front()->inbox.AwaitProceed(transfer, deadline);
  if (!let_in.ok()) return let_in.status();
  if (!*let_in) return 0;  // refused: answered, nothing more goes
  std::lock_guard<std::mutex> lock(others_mu_);
  std::vector<absl::StatusOr<int64_t>> sent(parts, 0);
  auto send = [&](int i) {
    const Stripe part = StripeOf(values.size(), parts, i);
    sent[i] = SendValues(lanes_[i]->socket, FrameKind::kPush, transfer,
                         values.subspan(part.offset, part.size), type, deadline);
  };
  std::vector<std::thread> helpers;  // the parts at once, each on a thread
  helpers.reserve(parts);
  for (int i = 2; i < parts; ++i) {
    try {
      helpers.emplace_back(send, i);
    } catch (const std::system_error&) {
      send(i);  // no thread to spare: sent from here, before the rest (each lane reads its own)
    }
  }
  send(1);
  for (std::thread& t : helpers) t.join();
  int64_t saturated = 0;
  for (int i = 1; i < parts; ++i) {
    if (!sent[i].ok()) {
      End();
      return sent[i].status();
    }
    saturated += *sent[i];
  }
  return saturated;
}

absl::StatusOr<int64_t> DataConnection::SendCall(FrameKind kind, uint64_t transfer,
                                                 const std::string& request,
                                                 absl::Span<const float> values, WireType type,
                                                 absl::Time deadline, const FillProgress* filling,
                                                 ValuesOrder order) {
  Socket& socket = lanes_.front()->socket;
  absl::StatusOr<int64_t> saturated = 0;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (absl::Status s = SendFrame(socket, {kind, transfer},
                                   EncodeCall({deadline - absl::Now(), request}), deadline);
        !s.ok()) {
      saturated = s;
    } else if (kind != FrameKind::kPullCall) {  // a push's or a change's values
      saturated =
          SendValues(socket, FrameKind::kPush, transfer, values, type, deadline, filling, 0, order);
    }
  }
  if (!saturated.ok()) End();
  return saturated;
}

absl::StatusOr<grpc::Status> DataConnection::AwaitAnswer(uint64_t transfer,
                                                         const std::string& answer,
                                                         std::string* response,
                                                         absl::Time deadline) {
  if (absl::Status s = lanes_.front()->inbox.AwaitAnswer(transfer, deadline); !s.ok()) return s;
  absl::StatusOr<grpc::Status> status = DecodeAnswer(answer, response);
  if (!status.ok()) End();
  return status;
}

absl::StatusOr<DataConnection::Answered> DataConnection::PushCall(
    uint64_t transfer, const std::string& header, absl::Span<const float> values, WireType type,
    absl::Time deadline, FrameKind kind, const FillProgress* filling, ValuesOrder order,
    absl::Duration answer_within) {
  FrameInbox& first = lanes_.front()->inbox;
  std::string answer;
  if (absl::Status s = first.ExpectAnswer(transfer, &answer); !s.ok()) return s;
  // A push's tensor of several MiB goes striped: its first part with the call, the others, on
  // their lanes, once the shard let the call in (while the first is still going).
  const int parts = kind == FrameKind::kPushCall ? StripeCount(values.size(), type, lanes()) : 1;
  const Stripe head = StripeOf(values.size(), parts, 0);
  absl::StatusOr<int64_t> others = 0;
  std::thread sending_others;
  if (parts > 1) {
    try {
      sending_others =
          std::thread([&] { others = SendOtherParts(transfer, values, type, parts, deadline); });
    } catch (const std::system_error&) {
      // No thread to spare: sent after the first part, which the shard reads once it let the
      // call in.
    }
  }
  absl::StatusOr<int64_t> saturated =
      SendCall(kind, transfer, header, values.subspan(head.offset, head.size), type, deadline,
               filling, order);
  if (sending_others.joinable()) {
    sending_others.join();
  } else if (parts > 1 && saturated.ok()) {
    others = SendOtherParts(transfer, values, type, parts, deadline);
  }
  if (saturated.ok() && !others.ok()) saturated = others.status();
  if (!saturated.ok()) {
    first.AwaitAnswer(transfer, absl::InfinitePast()).IgnoreError();  // forgets it
    return saturated.status();
  }
  Answered answered;
  absl::StatusOr<grpc::Status> status = AwaitAnswer(
      transfer, answer, &answered.response, std::min(deadline, absl::Now() + answer_within));
  if (!status.ok()) return status.status();
  answered.status = *std::move(status);
  answered.saturated = *saturated + *others;
  return answered;
}

absl::StatusOr<DataConnection::Answered> DataConnection::PullCall(
    uint64_t transfer, const std::string& request, absl::Span<float> dst, WireType type,
    absl::Time deadline, ValuesSeen on_read) {
  FrameInbox& first = lanes_.front()->inbox;
  std::string answer;
  if (absl::Status s = ExpectStriped(inboxes_, transfer, dst, type, on_read); !s.ok()) return s;
  absl::Status expected = first.ExpectAnswer(transfer, &answer);
  absl::Status sent =
      expected.ok() ? SendCall(FrameKind::kPullCall, transfer, request, {}, type, deadline).status()
                    : expected;
  Answered answered;
  absl::StatusOr<grpc::Status> status = absl::UnknownError("unanswered");
  if (sent.ok()) {
    status = AwaitAnswer(transfer, answer, &answered.response, deadline);
  } else {
    if (expected.ok()) first.AwaitAnswer(transfer, absl::InfinitePast()).IgnoreError();
    status = sent;
  }
  // The values came before an OK answer (or are on their way on the other lanes); after any
  // other, none come: their place is forgotten at once.
  const bool coming = status.ok() && status->ok();
  absl::Status arrived =
      AwaitStriped(inboxes_, transfer, dst.size(), type, coming ? deadline : absl::InfinitePast());
  if (!status.ok()) return status.status();
  if (coming && !arrived.ok()) return arrived;
  answered.status = *std::move(status);
  return answered;
}

}  // namespace ps
