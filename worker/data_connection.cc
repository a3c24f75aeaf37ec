#include "worker/data_connection.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/data_frames.h"

namespace ps {

absl::StatusOr<std::unique_ptr<DataConnection>> DataConnection::Open(
    const std::string& host, int port, uint64_t connection, const std::string& secret,
    uint64_t max_bytes, absl::Time deadline, absl::Duration stall) {
  absl::StatusOr<Socket> socket = Socket::Connect(host, port, deadline, stall);
  if (!socket.ok()) return socket.status();
  absl::Status s = SendFrame(*socket, {FrameKind::kHello, connection}, secret, deadline);
  absl::StatusOr<FrameHeader> answer = s.ok() ? ReceiveHeader(*socket, deadline) : s;
  if (answer.ok() && answer->kind == FrameKind::kRefused && answer->bytes <= kMaxRefusalBytes) {
    std::string why(answer->bytes, '\0');
    s = socket->Receive(why.data(), why.size(), deadline);
    return absl::UnavailableError(absl::StrCat("the shard refused the data-plane connection: ",
                                               s.ok() ? why : std::string(s.message())));
  }
  if (answer.ok() && (answer->kind != FrameKind::kWelcome || answer->bytes != 0)) {
    return absl::UnavailableError("the shard answered the data-plane hello with another frame");
  }
  if (!answer.ok()) {
    return absl::UnavailableError(
        absl::StrCat("data-plane hello to ", host, ":", port, ": ", answer.status().message()));
  }
  return std::unique_ptr<DataConnection>(
      new DataConnection(*std::move(socket), connection, max_bytes));
}

DataConnection::DataConnection(Socket socket, uint64_t id, uint64_t max_bytes)
    : socket_(std::move(socket)), id_(id), inbox_(&socket_, FrameKind::kPull, max_bytes) {
  reader_ = std::thread([this] { inbox_.ReadLoop().IgnoreError(); });
}

DataConnection::~DataConnection() {
  inbox_.End();
  reader_.join();
}

absl::StatusOr<int64_t> DataConnection::Push(uint64_t transfer, absl::Span<const float> values,
                                             WireType type, absl::Time deadline) {
  std::lock_guard<std::mutex> lock(send_mu_);
  absl::StatusOr<int64_t> sent =
      SendValues(socket_, FrameKind::kPush, transfer, values, type, deadline);
  if (!sent.ok()) inbox_.End();
  return sent;
}

}  // namespace ps
