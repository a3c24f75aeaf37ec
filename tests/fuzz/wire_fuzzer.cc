#include "tests/fuzz/wire_fuzzer.h"

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/version.h"
#include "transport/chunking.h"
#include "common/partition.h"
#include "transport/shared_memory.h"
#include "common/wire_type.h"
#include "proto/ps.grpc.pb.h"
#include "proto/ps.pb.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
// Above gRPC's default 4 MiB receive limit.
constexpr size_t kOversizedBytes = 5 << 20;
constexpr size_t kMaxBreaches = 20;

enum class Method {
  kRegister,
  kInitialize,
  kPush,
  kPull,
  kHeartbeat,
  kLeave,
  kGetStats,
  kAttachSharedMemory
};

const char* Name(Method m) {
  switch (m) {
    case Method::kRegister:
      return "Register";
    case Method::kInitialize:
      return "Initialize";
    case Method::kPush:
      return "Push";
    case Method::kPull:
      return "Pull";
    case Method::kHeartbeat:
      return "Heartbeat";
    case Method::kLeave:
      return "Leave";
    case Method::kAttachSharedMemory:
      return "AttachSharedMemory";
    default:
      return "GetStats";
  }
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

bool Breaks(grpc::StatusCode code) {
  return code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Deterministic for a seed on every platform (the std:: distributions are not).
class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  uint64_t Next() { return engine_(); }
  // Uniform in [0, n). REQUIRES: n > 0.
  int64_t Below(int64_t n) { return static_cast<int64_t>(engine_() % static_cast<uint64_t>(n)); }
  bool OneIn(int64_t n) { return Below(n) == 0; }
  template <typename T>
  T Pick(std::initializer_list<T> values) {
    return values.begin()[Below(static_cast<int64_t>(values.size()))];
  }
  std::string Bytes(int64_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(engine_());
    return s;
  }
  // `n` finite float32 values in [-1, 1), as wire bytes.
  std::string Floats(int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(static_cast<double>(engine_() >> 11) * 0x1p-52 - 1);
    return std::string(AsBytes(v));
  }

 private:
  std::mt19937_64 engine_;
};

// A client stream as the fuzzer sends it.
template <typename Chunk>
struct Stream {
  std::vector<Chunk> chunks;
  bool cancel = false;  // the client cancels after its last chunk instead of half-closing
  std::string shape;    // how it was built, for the list of breaches
};

class WireFuzzer {
 public:
  WireFuzzer(const FuzzTarget& target, const FuzzOptions& options, const v1::StatsResponse& shard,
             FuzzReport* report);

  // Builds one malformed request and sends it.
  void SendOne();

 private:
  // Field values: boundary values, values in and around the shard's range, random ones.
  int32_t WorkerId();
  int64_t Sequence();
  int64_t BaseVersion();
  std::pair<int64_t, int64_t> OffsetAndLength();
  v1::DType DType();
  // The right identity, one with a field wrong, or none.
  void MaybeSetModel(v1::ModelIdentity* m);

  v1::RegisterRequest MakeRegister();
  v1::PullRequest MakePull();
  v1::HeartbeatRequest MakeHeartbeat();
  v1::LeaveRequest MakeLeave();
  v1::AttachSharedMemoryRequest MakeAttach();
  // Sometimes names a shared-memory segment (one that does not exist: ids are random 63-bit).
  template <typename Message>
  void MaybeNameSegment(Message* m);
  Stream<v1::InitializeChunk> MakeInitialize();
  Stream<v1::PushChunk> MakePush();
  // Chunks carrying `header` and about `declared` values, in one of many wrong (or right) shapes.
  template <typename Chunk, typename Header>
  Stream<Chunk> MakeStream(const Header& header, int64_t declared);
  // Whether some prefix of `chunks` is a push the shard could apply. Conservative: it mirrors the
  // shard's documented checks and counts anything else (duplicates included) as applicable.
  bool CouldApply(const std::vector<v1::PushChunk>& chunks) const;
  // The chunks a shard may parse from raw Push messages: up to the first that fails to parse,
  // where its stream ends.
  static std::vector<v1::PushChunk> ParsedPushes(const std::vector<std::string>& messages);
  // A structured request for `m` (the chunks of a stream), serialised.
  std::vector<std::string> Serialized(Method m, bool* cancel);
  void Mutate(std::string* bytes);

  void StubCall(Method m);
  void RawCall(Method m);
  void UnknownMethod();
  // One call through the generic stub: writes `messages`, half-closes (or cancels), reads every
  // response (the last into `response` if set) and returns the status. Cancels a call still
  // running at deadline + slack.
  grpc::Status Generic(const std::string& path, const std::vector<std::string>& messages,
                       bool cancel, std::string* response);
  void Record(const std::string& row, const std::string& how, const grpc::Status& status,
              absl::Duration took);
  void RecordAcceptedWrite(const std::string& row, const std::string& how);

  const FuzzTarget& target_;
  const FuzzOptions& options_;
  const Range range_;
  const int64_t version_;
  std::set<int> registered_;  // every worker id that any Register may have recorded
  Random rng_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  grpc::GenericStub generic_;
  FuzzReport* report_;
};

WireFuzzer::WireFuzzer(const FuzzTarget& target, const FuzzOptions& options,
                       const v1::StatsResponse& shard, FuzzReport* report)
    : target_(target),
      options_(options),
      range_{shard.begin(), shard.end()},
      version_(shard.version()),
      rng_(options.seed),
      stub_(v1::ParameterServer::NewStub(
          grpc::CreateChannel(target.addresses[target.shard], grpc::InsecureChannelCredentials()))),
      generic_(
          grpc::CreateChannel(target.addresses[target.shard], grpc::InsecureChannelCredentials())),
      report_(report) {
  for (const v1::WorkerStats& w : shard.workers()) registered_.insert(w.worker_id());
}

int32_t WireFuzzer::WorkerId() {
  switch (rng_.Below(6)) {
    case 0:
      return rng_.Pick<int32_t>(
          {kInt32Min, kInt32Min + 1, -2, -1, 0, 1, 63, 64, kInt32Max - 1, kInt32Max});
    case 1:
      return static_cast<int32_t>(rng_.Next());
    case 2:
      return static_cast<int32_t>(rng_.Below(130)) - 1;
    default: {  // one that may be registered, so that pushes get past the membership check
      if (registered_.empty()) return 0;
      auto it = registered_.begin();
      std::advance(it, rng_.Below(static_cast<int64_t>(registered_.size())));
      return *it;
    }
  }
}

int64_t WireFuzzer::Sequence() {
  if (rng_.OneIn(4)) return static_cast<int64_t>(rng_.Next());
  return rng_.Pick<int64_t>(
      {kInt64Min, -1, 0, 1, 2, int64_t{1} << 31, int64_t{1} << 62, kInt64Max - 1, kInt64Max});
}

int64_t WireFuzzer::BaseVersion() {
  if (rng_.OneIn(5)) return static_cast<int64_t>(rng_.Next());
  return rng_.Pick<int64_t>(
      {kInt64Min, -1, 0, version_, version_, version_ + 1, int64_t{1} << 62, kInt64Max});
}

std::pair<int64_t, int64_t> WireFuzzer::OffsetAndLength() {
  const int64_t b = range_.begin, e = range_.end, n = target_.model.total_params;
  if (rng_.OneIn(2)) {  // inside the range, or one off
    int64_t offset = b + rng_.Below(e - b);
    int64_t length = 1 + rng_.Below(e - offset);
    if (rng_.OneIn(4)) offset += rng_.Pick<int64_t>({-1, 1});
    if (rng_.OneIn(4)) length += rng_.Pick<int64_t>({-1, 1});
    return {offset, length};
  }
  auto edge = [&] {
    if (rng_.OneIn(5)) return static_cast<int64_t>(rng_.Next());
    return rng_.Pick<int64_t>({kInt64Min,
                               kInt64Min + 1,
                               -(int64_t{1} << 62),
                               -1,
                               0,
                               1,
                               b - 1,
                               b,
                               b + 1,
                               e - 1,
                               e,
                               e + 1,
                               e - b,
                               n,
                               kInt32Max,
                               int64_t{1} << 32,
                               int64_t{1} << 62,
                               kInt64Max - b + 1,
                               kInt64Max - 1,
                               kInt64Max});
  };
  int64_t offset = edge();
  return {offset, edge()};
}

v1::DType WireFuzzer::DType() {
  if (rng_.OneIn(2)) return v1::FLOAT32;
  return static_cast<v1::DType>(
      rng_.Pick<int32_t>({v1::DTYPE_UNSPECIFIED, 2, 3, v1::ONEBIT, v1::TOPK, v1::INT8, -1, 1000,
                          kInt32Max, kInt32Min}));
}

void WireFuzzer::MaybeSetModel(v1::ModelIdentity* m) {
  if (rng_.OneIn(10)) return;  // no identity at all
  const ModelIdentity& right = target_.model;
  m->set_fingerprint(right.fingerprint);
  m->set_total_params(right.total_params);
  m->set_num_shards(right.num_shards);
  switch (rng_.Below(8)) {
    case 0:
      m->set_fingerprint(
          rng_.Pick<std::string>({"", "x", right.fingerprint + "x", right.fingerprint.substr(1),
                                  std::string(64 << 10, 'f')}));
      break;
    case 1:
      m->set_total_params(rng_.Pick<int64_t>(
          {kInt64Min, -1, 0, right.total_params - 1, right.total_params + 1, kInt64Max}));
      break;
    case 2:
      m->set_num_shards(rng_.Pick<int32_t>(
          {kInt32Min, -1, 0, right.num_shards - 1, right.num_shards + 1, kInt32Max}));
      break;
    case 3:
      m->set_total_params(static_cast<int64_t>(rng_.Next()));
      m->set_num_shards(static_cast<int32_t>(rng_.Next()));
      break;
    default:  // right
      break;
  }
}

v1::RegisterRequest WireFuzzer::MakeRegister() {
  v1::RegisterRequest r;
  r.set_worker_id(WorkerId());
  MaybeSetModel(r.mutable_model());
  StampRelease(&r);
  if (r.worker_id() >= 0) registered_.insert(r.worker_id());
  return r;
}

v1::PullRequest WireFuzzer::MakePull() {
  v1::PullRequest r;
  auto [offset, length] = rng_.OneIn(4) ? std::pair<int64_t, int64_t>{0, 0} : OffsetAndLength();
  r.set_offset(offset);
  r.set_length(length);
  r.set_worker_id(WorkerId());
  MaybeSetModel(r.mutable_model());
  MaybeNameSegment(&r);
  return r;
}

v1::AttachSharedMemoryRequest WireFuzzer::MakeAttach() {
  v1::AttachSharedMemoryRequest r;
  r.set_worker_id(WorkerId());
  MaybeSetModel(r.mutable_model());
  r.set_process_space(
      rng_.Pick<std::string>({ProcessSpaceId(), ProcessSpaceId(), "", absl::StrCat(rng_.Next())}));
  if (rng_.OneIn(3)) r.set_shard_incarnation(static_cast<int64_t>(rng_.Next()));
  return r;
}

template <typename Message>
void WireFuzzer::MaybeNameSegment(Message* m) {
  if (!rng_.OneIn(5)) return;
  m->mutable_path()->set_shm_segment(rng_.Pick<int64_t>({1, -1, kInt64Max, static_cast<int64_t>(rng_.Next())}));
  m->mutable_path()->set_shm_ticket(rng_.Next());
}

v1::HeartbeatRequest WireFuzzer::MakeHeartbeat() {
  v1::HeartbeatRequest r;
  r.set_worker_id(WorkerId());
  return r;
}

v1::LeaveRequest WireFuzzer::MakeLeave() {
  v1::LeaveRequest r;
  r.set_worker_id(WorkerId());
  return r;
}

template <typename Chunk, typename Header>
Stream<Chunk> WireFuzzer::MakeStream(const Header& header, int64_t declared) {
  enum Shape {
    kWhole,
    kEndless,
    kNoChunks,
    kNoHeader,
    kHeaderTwice,
    kHeaderLate,
    kPartialFloat,
    kNonFinite,
    kEmptyChunks,
    kOversized,
    kNumShapes
  };
  static constexpr const char* kShapeNames[] = {
      "whole",       "endless",       "no chunks",  "no header",         "header twice",
      "header late", "partial float", "non-finite", "empty data chunks", "oversized chunk"};
  auto shape = static_cast<Shape>(rng_.Below(kNumShapes + 4));  // "whole" five times as often
  if (shape >= kNumShapes || (shape == kOversized && !rng_.OneIn(4))) shape = kWhole;
  Stream<Chunk> s;
  s.shape = kShapeNames[shape];
  // The payload: the declared number of values when that many could be right, one more or less,
  // or any number up to the shard's size.
  const int64_t shard = range_.size();
  int64_t floats = declared >= 0 && declared <= shard + 1 ? declared : rng_.Below(shard + 2);
  floats = std::max<int64_t>(0, floats + rng_.Pick<int64_t>({0, 0, 0, -1, 1}));
  const int64_t pieces = rng_.Pick<int64_t>({1, 1, 2, 3, 8});
  const int64_t per_chunk = std::clamp<int64_t>((floats + pieces - 1) / pieces, 1, kChunkFloats);
  if (shape == kEndless) floats += per_chunk * (1 + rng_.Below(32));  // on past the declared end

  const std::string payload = rng_.Floats(floats);
  for (int64_t i = 0; i == 0 || i < floats; i += per_chunk) {
    s.chunks.emplace_back().set_data(payload.substr(i * sizeof(float), per_chunk * sizeof(float)));
  }
  *s.chunks[0].mutable_header() = header;
  auto any_chunk = [&]() -> Chunk& { return s.chunks[rng_.Below(s.chunks.size())]; };
  switch (shape) {
    case kNoChunks:
      s.chunks.clear();
      break;
    case kNoHeader:
      s.chunks[0].clear_header();
      break;
    case kHeaderTwice:
    case kHeaderLate:
      if (s.chunks.size() < 2) s.chunks.emplace_back();
      *s.chunks[1].mutable_header() = header;
      if (shape == kHeaderLate) s.chunks[0].clear_header();
      break;
    case kPartialFloat:
      any_chunk().mutable_data()->append(rng_.Bytes(1 + rng_.Below(3)));
      break;
    case kNonFinite: {
      Chunk& c = any_chunk();
      if (c.data().size() < sizeof(float)) c.mutable_data()->append(sizeof(float), '\0');
      float bad = rng_.Pick<float>({std::numeric_limits<float>::quiet_NaN(),
                                    std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity()});
      size_t at = rng_.Below(c.data().size() / sizeof(float)) * sizeof(float);
      std::memcpy(c.mutable_data()->data() + at, &bad, sizeof(float));
      break;
    }
    case kEmptyChunks:
      for (int i = 0; i < 3; ++i) {
        s.chunks.insert(s.chunks.begin() + 1 + rng_.Below(s.chunks.size()), Chunk());
      }
      break;
    case kOversized:
      s.chunks.insert(s.chunks.begin() + rng_.Below(s.chunks.size() + 1), Chunk())
          ->set_data(std::string(kOversizedBytes, '\0'));
      break;
    default:
      break;
  }
  if (rng_.OneIn(6)) {
    s.cancel = true;
    s.shape += ", cancelled";
  }
  return s;
}

Stream<v1::InitializeChunk> WireFuzzer::MakeInitialize() {
  v1::InitializeHeader h;
  MaybeSetModel(h.mutable_model());
  auto [offset, length] =
      rng_.OneIn(3) ? std::pair<int64_t, int64_t>{range_.begin, range_.size()} : OffsetAndLength();
  h.set_offset(offset);
  h.set_length(length);
  h.set_dtype(DType());
  return MakeStream<v1::InitializeChunk>(h, length);
}

Stream<v1::PushChunk> WireFuzzer::MakePush() {
  v1::PushHeader h;
  h.set_worker_id(WorkerId());
  h.set_sequence(Sequence());
  h.set_base_version(BaseVersion());
  auto [offset, length] = OffsetAndLength();
  h.set_offset(offset);
  h.set_length(length);
  h.set_dtype(DType());
  MaybeNameSegment(&h);
  Stream<v1::PushChunk> s = MakeStream<v1::PushChunk>(h, length);
  // A push the shard might apply would change the weights: spoil its header until it cannot.
  while (CouldApply(s.chunks)) {
    v1::PushHeader* bad = s.chunks[0].mutable_header();
    switch (rng_.Below(5)) {
      case 0:
        bad->set_worker_id(-1 - static_cast<int32_t>(rng_.Below(1000)));
        s.shape += ", unregistered worker";
        break;
      case 1:
        bad->set_sequence(-1 - rng_.Below(1000));
        s.shape += ", negative sequence";
        break;
      case 2:
        bad->set_base_version(version_ + 1 + rng_.Below(1000));
        s.shape += ", base version ahead";
        break;
      case 3:
        bad->set_dtype(v1::DTYPE_UNSPECIFIED);
        s.shape += ", no dtype";
        break;
      default:
        bad->set_offset(range_.end);
        s.shape += ", offset at the end";
        break;
    }
  }
  return s;
}

bool WireFuzzer::CouldApply(const std::vector<v1::PushChunk>& chunks) const {
  if (chunks.empty() || !chunks[0].has_header()) return false;
  const v1::PushHeader& h = chunks[0].header();
  absl::StatusOr<PayloadFormat> format =
      PushPayloadFormat(h.dtype(), h.topk_pairs(), h.length());
  if (!format.ok() || h.path().shm_segment() != 0 || h.worker_id() < 0 ||
      registered_.count(h.worker_id()) == 0 || h.sequence() < 0 || h.base_version() < 0 ||
      h.base_version() > version_ || h.length() <= 0 || h.offset() < range_.begin ||
      h.offset() > range_.end - h.length()) {
    return false;
  }
  // Each failure below holds for every longer prefix too.
  std::vector<float> values(h.length());
  ChunkAssembler assembler(absl::MakeSpan(values), *format);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if ((i > 0 && chunks[i].has_header()) || !assembler.Append(chunks[i].data()).ok()) {
      return false;
    }
    if (assembler.Finish().ok()) {
      return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
    }
  }
  return false;
}

std::vector<v1::PushChunk> WireFuzzer::ParsedPushes(const std::vector<std::string>& messages) {
  std::vector<v1::PushChunk> chunks;
  for (const std::string& m : messages) {
    v1::PushChunk chunk;
    if (!chunk.ParseFromString(m)) break;
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

std::vector<std::string> WireFuzzer::Serialized(Method m, bool* cancel) {
  std::vector<std::string> out;
  auto add_stream = [&](const auto& stream) {
    *cancel = *cancel || stream.cancel;
    for (const auto& chunk : stream.chunks) out.push_back(chunk.SerializeAsString());
  };
  switch (m) {
    case Method::kRegister:
      out.push_back(MakeRegister().SerializeAsString());
      break;
    case Method::kInitialize:
      add_stream(MakeInitialize());
      break;
    case Method::kPush:
      add_stream(MakePush());
      break;
    case Method::kPull:
      out.push_back(MakePull().SerializeAsString());
      break;
    case Method::kHeartbeat:
      out.push_back(MakeHeartbeat().SerializeAsString());
      break;
    case Method::kLeave:
      out.push_back(MakeLeave().SerializeAsString());
      break;
    case Method::kGetStats:
      out.push_back(v1::StatsRequest().SerializeAsString());
      break;
    case Method::kAttachSharedMemory:
      out.push_back(MakeAttach().SerializeAsString());
      break;
  }
  return out;
}

void WireFuzzer::Mutate(std::string* bytes) {
  int64_t op = bytes->empty() ? 2 : rng_.Below(5);
  switch (op) {
    case 0:  // flip a few bits
      for (int64_t i = 1 + rng_.Below(4); i > 0; --i) {
        (*bytes)[rng_.Below(bytes->size())] ^= static_cast<char>(1 << rng_.Below(8));
      }
      break;
    case 1:
      bytes->resize(rng_.Below(bytes->size()));
      break;
    case 2:
      bytes->append(rng_.Bytes(1 + rng_.Below(16)));
      break;
    case 3:
      bytes->insert(rng_.Below(bytes->size() + 1), rng_.Bytes(1 + rng_.Below(8)));
      break;
    default:  // a varint that never ends, or a field number/wire type that does not exist
      (*bytes)[rng_.Below(bytes->size())] = rng_.Pick<char>({'\x80', '\xff', '\x07', '\x0f'});
      break;
  }
}

void WireFuzzer::StubCall(Method m) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  grpc::Status status;
  std::string how;
  const std::string row = absl::StrCat(Name(m), " stub");
  const absl::Time start = absl::Now();
  switch (m) {
    case Method::kRegister: {
      v1::RegisterRequest request = MakeRegister();
      how = absl::StrCat("worker ", request.worker_id());
      v1::RegisterResponse response;
      status = stub_->Register(&context, request, &response);
      break;
    }
    case Method::kInitialize:
    case Method::kPush: {
      // Writes a stream's chunks, stopping early once the shard has answered.
      auto send = [&](const auto& stream, auto writer) {
        how = stream.shape;
        for (const auto& chunk : stream.chunks) {
          if (!writer->Write(chunk)) break;
        }
        if (stream.cancel) {
          context.TryCancel();
        } else {
          writer->WritesDone();
        }
        return writer->Finish();
      };
      if (m == Method::kPush) {
        v1::PushResponse response;
        status = send(MakePush(), stub_->Push(&context, &response));
        if (status.ok()) RecordAcceptedWrite(row, how);
      } else {
        v1::InitializeResponse response;
        status = send(MakeInitialize(), stub_->Initialize(&context, &response));
        if (status.ok() && response.applied()) RecordAcceptedWrite(row, how);
      }
      break;
    }
    case Method::kPull: {
      v1::PullRequest request = MakePull();
      const int64_t read = rng_.Below(4);  // 0: cancel at once, 1: after a chunk, else read all
      how = absl::StrCat("[", request.offset(), ", +", request.length(), ") read mode ", read);
      std::unique_ptr<grpc::ClientReader<v1::PullChunk>> reader = stub_->Pull(&context, request);
      if (read == 0) context.TryCancel();
      v1::PullChunk chunk;
      while (reader->Read(&chunk)) {
        if (read == 1) context.TryCancel();
      }
      status = reader->Finish();
      break;
    }
    case Method::kHeartbeat: {
      v1::HeartbeatResponse response;
      status = stub_->Heartbeat(&context, MakeHeartbeat(), &response);
      break;
    }
    case Method::kLeave: {
      v1::LeaveResponse response;
      status = stub_->Leave(&context, MakeLeave(), &response);
      break;
    }
    case Method::kGetStats: {
      v1::StatsResponse response;
      status = stub_->GetStats(&context, v1::StatsRequest(), &response);
      break;
    }
    case Method::kAttachSharedMemory: {
      v1::AttachSharedMemoryRequest request = MakeAttach();
      how = absl::StrCat("worker ", request.worker_id());
      v1::AttachSharedMemoryResponse response;
      status = stub_->AttachSharedMemory(&context, request, &response);
      break;
    }
  }
  Record(row, how, status, absl::Now() - start);
}

void WireFuzzer::RawCall(Method m) {
  std::vector<std::string> messages;
  bool cancel = false;
  std::string how;
  do {  // until no prefix of it is a push the shard could apply
    messages.clear();
    cancel = rng_.OneIn(8);
    switch (rng_.Below(8)) {
      case 0:
      case 1: {
        how = "random bytes";
        int64_t up_to = rng_.Pick<int64_t>({0, 8, 64, 4096, 65536});
        messages.push_back(rng_.Bytes(up_to == 0 ? 0 : 1 + rng_.Below(up_to)));
        break;
      }
      case 2:
      case 3:
        how = "mutated";
        messages = Serialized(m, &cancel);
        if (!messages.empty()) Mutate(&messages[rng_.Below(messages.size())]);
        break;
      case 4:
        how = "no message";
        break;
      case 5: {
        how = "several messages";
        messages = Serialized(m, &cancel);
        std::vector<std::string> more = Serialized(m, &cancel);
        messages.insert(messages.end(), more.begin(), more.end());
        messages.push_back(rng_.Bytes(rng_.Below(32)));
        break;
      }
      case 6:  // proto3 refuses to parse a string field that is not UTF-8
        how = "invalid UTF-8";
        messages = Serialized(m, &cancel);
        for (std::string& message : messages) {
          message = absl::StrReplaceAll(
              message,
              {{target_.model.fingerprint, std::string(target_.model.fingerprint.size(), '\xff')}});
        }
        break;
      default:
        how = "oversized message";
        messages.push_back(std::string(kOversizedBytes, '\x0a'));
        break;
    }
  } while (m == Method::kPush && CouldApply(ParsedPushes(messages)));
  if (m == Method::kRegister) {
    google::protobuf::LogSilencer quiet;  // parsing invalid UTF-8 logs an error each time
    for (const std::string& message : messages) {
      v1::RegisterRequest request;
      if (request.ParseFromString(message) && request.worker_id() >= 0) {
        registered_.insert(request.worker_id());
      }
    }
  }
  if (cancel) how += ", cancelled";
  const std::string row = absl::StrCat(Name(m), " raw");
  std::string response;
  const absl::Time start = absl::Now();
  grpc::Status status =
      Generic(absl::StrCat("/", v1::ParameterServer::service_full_name(), "/", Name(m)), messages,
              cancel, &response);
  Record(row, how, status, absl::Now() - start);
  v1::InitializeResponse initialized;
  if (status.ok() &&
      (m == Method::kPush || (m == Method::kInitialize && initialized.ParseFromString(response) &&
                              initialized.applied()))) {
    RecordAcceptedWrite(row, how);
  }
}

void WireFuzzer::UnknownMethod() {
  std::string path =
      rng_.Pick<std::string>({"/ps.v1.ParameterServer/Nope", "/ps.v2.ParameterServer/Push",
                              "/ps.v1.ParameterServer/push"});
  const absl::Time start = absl::Now();
  grpc::Status status = Generic(path, {rng_.Bytes(rng_.Below(64))}, false, nullptr);
  Record("unknown method raw", path, status, absl::Now() - start);
}

grpc::Status WireFuzzer::Generic(const std::string& path, const std::vector<std::string>& messages,
                                 bool cancel, std::string* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      generic_.PrepareCall(&context, path, &cq);
  const absl::Time give_up = absl::Now() + options_.deadline + options_.slack;
  // One operation is in flight at a time; waits for it. False: it failed (the stream is over).
  auto completed = [&] {
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, absl::ToChronoTime(give_up)) == grpc::CompletionQueue::TIMEOUT) {
      context.TryCancel();  // a hang; the caller sees it in the elapsed time
      cq.Next(&tag, &ok);
    }
    return ok;
  };
  void* const tag = &context;
  call->StartCall(tag);
  bool open = completed();
  for (size_t i = 0; open && i < messages.size(); ++i) {
    grpc::Slice slice(messages[i]);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, tag);
    open = completed();
  }
  if (cancel) {
    context.TryCancel();
  } else if (open) {
    call->WritesDone(tag);
    completed();
  }
  for (;;) {
    grpc::ByteBuffer received;
    call->Read(&received, tag);
    if (!completed()) break;
    std::vector<grpc::Slice> slices;
    if (response != nullptr && received.Dump(&slices).ok()) {
      response->clear();
      for (const grpc::Slice& s : slices) response->append(s.begin(), s.end());
    }
  }
  grpc::Status status;
  call->Finish(&status, tag);
  completed();
  cq.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (cq.Next(&ignored_tag, &ignored_ok)) {
  }
  return status;
}

void WireFuzzer::Record(const std::string& row, const std::string& how, const grpc::Status& status,
                        absl::Duration took) {
  ++report_->counts[row][status.error_code()];
  report_->slowest_call = std::max(report_->slowest_call, took);
  const bool hang = took > options_.deadline + options_.slack;
  report_->hangs += hang;
  if ((hang || Breaks(status.error_code())) && report_->breaches.size() < kMaxBreaches) {
    report_->breaches.push_back(absl::StrCat(row, " (", how, "): ", CodeName(status.error_code()),
                                             " '", status.error_message(), "' after ",
                                             absl::FormatDuration(took)));
  }
}

void WireFuzzer::RecordAcceptedWrite(const std::string& row, const std::string& how) {
  ++report_->accepted_writes;
  if (report_->breaches.size() < kMaxBreaches) {
    report_->breaches.push_back(absl::StrCat(row, " (", how, "): accepted, built to be invalid"));
  }
}

void WireFuzzer::SendOne() {
  // Pushes most: they have the most fields and the only path to the weights.
  static constexpr Method kMix[] = {Method::kPush,
                                    Method::kPush,
                                    Method::kPush,
                                    Method::kPush,
                                    Method::kPush,
                                    Method::kInitialize,
                                    Method::kInitialize,
                                    Method::kPull,
                                    Method::kPull,
                                    Method::kPull,
                                    Method::kRegister,
                                    Method::kRegister,
                                    Method::kHeartbeat,
                                    Method::kHeartbeat,
                                    Method::kLeave,
                                    Method::kLeave,
                                    Method::kGetStats,
                                    Method::kAttachSharedMemory,
                                    Method::kAttachSharedMemory};
  if (rng_.OneIn(40)) return UnknownMethod();
  Method m = kMix[rng_.Below(std::size(kMix))];
  if (rng_.Below(5) < 2) {
    RawCall(m);
  } else {
    StubCall(m);
  }
}

// What the weights check compares: a full pull and every shard's statistics.
struct Snapshot {
  std::vector<float> weights;
  ShardedClient::Versions versions;
  std::vector<v1::StatsResponse> stats;
};

absl::StatusOr<Snapshot> TakeSnapshot(ShardedClient& observer) {
  Snapshot s;
  s.weights.resize(observer.model().total_params);
  absl::StatusOr<ShardedClient::Versions> versions = observer.Pull(absl::MakeSpan(s.weights));
  if (!versions.ok()) return versions.status();
  s.versions = *std::move(versions);
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = observer.Stats();
  if (!stats.ok()) return stats.status();
  s.stats = *std::move(stats);
  return s;
}

// "" if `after` holds what `before` did; else what differs.
std::string Difference(const Snapshot& before, const Snapshot& after) {
  std::vector<std::string> what;
  int64_t changed = 0;
  for (size_t i = 0; i < before.weights.size(); ++i) {
    changed += std::memcmp(&before.weights[i], &after.weights[i], sizeof(float)) != 0;
  }
  if (changed > 0) what.push_back(absl::StrCat(changed, " weights changed"));
  for (size_t i = 0; i < before.stats.size(); ++i) {
    const v1::StatsResponse &b = before.stats[i], &a = after.stats[i];
    if (a.version() != b.version() || a.pushes_applied() != b.pushes_applied() ||
        after.versions.version[i] != before.versions.version[i]) {
      what.push_back(absl::StrCat("shard ", i, ": version ", b.version(), " -> ", a.version(),
                                  ", pushes applied ", b.pushes_applied(), " -> ",
                                  a.pushes_applied()));
    }
  }
  return absl::StrJoin(what, "; ");
}

}  // namespace

bool FuzzReport::Held() const {
  return Count(grpc::StatusCode::INTERNAL) == 0 && Count(grpc::StatusCode::UNKNOWN) == 0 &&
         Count(grpc::StatusCode::DEADLINE_EXCEEDED) == 0 && hangs == 0 && accepted_writes == 0 &&
         weights_identical;
}

int64_t FuzzReport::Count(grpc::StatusCode code) const {
  int64_t n = 0;
  for (const auto& [row, by_code] : counts) {
    if (auto it = by_code.find(code); it != by_code.end()) n += it->second;
  }
  return n;
}

std::string FuzzReport::Table() const {
  std::set<grpc::StatusCode> codes = {grpc::StatusCode::INTERNAL, grpc::StatusCode::UNKNOWN};
  for (const auto& [row, by_code] : counts) {
    for (const auto& [code, n] : by_code) codes.insert(code);
  }
  auto width = [](grpc::StatusCode code) { return std::max<int>(CodeName(code).size(), 6); };
  std::string out = absl::StrFormat("%-20s %7s", "method", "calls");
  for (grpc::StatusCode code : codes) {
    absl::StrAppend(&out, absl::StrFormat(" %*s", width(code), CodeName(code)));
  }
  out += "\n";
  auto line = [&](const std::string& row, const std::map<grpc::StatusCode, int64_t>& by_code) {
    int64_t calls = 0;
    for (const auto& [code, n] : by_code) calls += n;
    absl::StrAppend(&out, absl::StrFormat("%-20s %7d", row, calls));
    for (grpc::StatusCode code : codes) {
      auto it = by_code.find(code);
      absl::StrAppend(&out,
                      absl::StrFormat(" %*d", width(code), it == by_code.end() ? 0 : it->second));
    }
    out += "\n";
  };
  std::map<grpc::StatusCode, int64_t> total;
  for (const auto& [row, by_code] : counts) {
    line(row, by_code);
    for (const auto& [code, n] : by_code) total[code] += n;
  }
  line("all", total);
  return out;
}

std::string FuzzReport::Summary() const {
  std::string out = absl::StrFormat("%d requests in %s (%.0f/s), slowest call %s\n", requests,
                                    absl::FormatDuration(elapsed),
                                    static_cast<double>(requests) / absl::ToDoubleSeconds(elapsed),
                                    absl::FormatDuration(slowest_call));
  absl::StrAppend(&out, "INTERNAL ", Count(grpc::StatusCode::INTERNAL), ", UNKNOWN ",
                  Count(grpc::StatusCode::UNKNOWN), ", DEADLINE_EXCEEDED ",
                  Count(grpc::StatusCode::DEADLINE_EXCEEDED), ", hangs ", hangs,
                  ", invalid writes accepted ", accepted_writes, "\n");
  absl::StrAppend(&out, "weights, versions and applied pushes after == before: ",
                  weights_identical ? "yes" : absl::StrCat("NO (", weights_detail, ")"), "\n");
  for (const std::string& b : breaches) absl::StrAppend(&out, "  breach: ", b, "\n");
  return out;
}

absl::StatusOr<FuzzTarget> StartFuzzCluster(LocalCluster& cluster, int64_t total_params) {
  const std::string model = absl::StrCat("flat:", total_params);
  // Worker ids up to 63 are the job's; the fuzzer also tries 64 and beyond.
  if (absl::Status s = cluster.StartShards(2, model, 64, {"--optimizer=sgd"}); !s.ok()) return s;
  FuzzTarget target{
      {cluster.ShardAddress(0), cluster.ShardAddress(1)}, 1, {model, total_params, 2}};
  ShardedClient initialiser(target.addresses, target.model, /*worker_id=*/0);
  if (absl::StatusOr<int64_t> next = initialiser.Register(); !next.ok()) return next.status();
  std::vector<float> values(total_params);
  for (int64_t i = 0; i < total_params; ++i) values[i] = 0.001f * static_cast<float>(i % 2000) - 1;
  if (absl::StatusOr<int> applied = initialiser.Initialize(values); !applied.ok()) {
    return applied.status();
  }
  return target;
}

absl::StatusOr<FuzzReport> RunWireFuzz(const FuzzTarget& target, const FuzzOptions& options) {
  ShardedClient observer(target.addresses, target.model, /*worker_id=*/-1,
                         ClientOptions{options.deadline, options.deadline});
  absl::StatusOr<Snapshot> before = TakeSnapshot(observer);
  if (!before.ok()) return before.status();
  const v1::StatsResponse& shard = before->stats[target.shard];
  if (!shard.initialized()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", target.shard, " is not initialised"));
  }
  FuzzReport report;
  WireFuzzer fuzzer(target, options, shard, &report);
  const absl::Time start = absl::Now();
  for (report.requests = 0; report.requests < options.requests; ++report.requests) {
    fuzzer.SendOne();
  }
  report.elapsed = absl::Now() - start;
  absl::StatusOr<Snapshot> after = TakeSnapshot(observer);
  report.weights_detail =
      after.ok() ? Difference(*before, *after)
                 : absl::StrCat("cannot read the shards after the run: ", after.status().message());
  report.weights_identical = report.weights_detail.empty();
  return report;
}

}  // namespace ps
