// Checkpoints: the safetensors file format, a shard's state round trip, corruption fallback, and a
// real ps stopped and restarted from its checkpoint directory.
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/safetensors.h"
#include "deploy/local_cluster.h"
#include "server/checkpoints/checkpoint_store.h"
#include "server/checkpoints/checkpointer.h"
#include "server/replication/state_transfer.h"
#include "server/state/parameter_shard.h"
#include "tests/run_dir.h"
#include "tools/model_export.h"
#include "trainer/model_file.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

TEST(SafetensorsTest, RoundTripsTensorsAndMetadataAndDetectsCorruption) {
  std::string path = NewRunDir("checkpoint") + "/t.safetensors";
  std::vector<float> a = {1.5f, -2, 3e38f}, b(1000, 0.25f);
  ASSERT_TRUE(WriteSafetensors(path, {{"a", {3}, a}, {"b.c", {10, 100}, b}}, {{"k", "v"}}).ok());
  absl::StatusOr<Safetensors> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metadata.at("k"), "v");
  EXPECT_EQ(read->tensors.at("a").data, a);
  EXPECT_EQ(read->tensors.at("b.c").shape, (std::vector<int64_t>{10, 100}));
  EXPECT_EQ(read->tensors.at("b.c").data, b);
  // The data starts 8-byte aligned after the header, as the format recommends.
  uint64_t header = 0;
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(&header), 8);
  EXPECT_EQ(header % 8, 0u);

  std::string bytes = ReadFile(path);
  auto write = [&](const std::string& contents) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
  };
  write(bytes.substr(0, bytes.size() - 7));  // torn
  EXPECT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kDataLoss);
  std::string flipped = bytes;
  flipped[flipped.size() - 1] ^= 1;  // one bit of the last tensor
  write(flipped);
  absl::Status s = ReadSafetensors(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s;
  write(std::string(4, 'x'));
  EXPECT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadSafetensors(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

// The checksum covers the whole file, metadata included: every single-bit change anywhere (the
// header length, the JSON, its padding, the checksum itself, the tensors) is refused, and a file
// of an older version, whose checksum covered the tensors only, is refused naming the reason.
TEST(SafetensorsTest, AChangeAnywhereInTheFileIsRefused) {
  const std::string path = NewRunDir("checkpoint") + "/t.safetensors";
  std::vector<float> a = {1.5f, -2, 3};
  ASSERT_TRUE(WriteSafetensors(path, {{"a", {3}, a}}, {{"version", "6225"}}).ok());
  const std::string bytes = ReadFile(path);
  auto write = [&](const std::string& contents) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
  };
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string changed = bytes;
      changed[i] ^= static_cast<char>(1 << bit);
      write(changed);
      ASSERT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kDataLoss)
          << "byte " << i << " bit " << bit;
    }
  }
  // An edit that keeps the JSON valid, as a person would make it: named as a checksum mismatch.
  std::string edited = bytes;
  const size_t at = edited.find("\"version\":\"6225\"");
  ASSERT_NE(at, std::string::npos);
  edited[at + 11] = '1';
  write(edited);
  absl::Status s = ReadSafetensors(path).status();
  EXPECT_EQ(s.message(), path +
                             ": checksum mismatch: the file is torn or was changed after it "
                             "was written (its header or its tensors)");
  write(bytes);
  ASSERT_TRUE(ReadSafetensors(path).ok());

  // The layout of the previous version, "crc32" over the tensor bytes only, still reads (an
  // upgraded shard resumes from its checkpoints), its tensors checked: a wrong crc32 is refused.
  for (const char* crc : {"0", "1"}) {
    std::string header =
        absl::StrCat(R"({"__metadata__":{"crc32":")", crc,
                     R"("},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})");
    header.append((8 - header.size() % 8) % 8, ' ');
    const uint64_t length = header.size();
    write(std::string(reinterpret_cast<const char*>(&length), 8) + header);
    s = ReadSafetensors(path).status();
    if (std::string(crc) == "0") {
      EXPECT_TRUE(s.ok()) << s;  // the CRC-32 of no bytes
    } else {
      EXPECT_EQ(s.message(),
                path + ": checksum mismatch: the tensors are corrupt or the file is torn");
    }
  }
}

ShardConfig AdamSsp() {
  ShardConfig c;
  c.model = "flat:6";
  c.num_workers = 3;
  c.optimizer.name = "adam";
  c.learning_rate.base = 0.1f;
  c.consistency = "ssp:2";
  return c;
}

const ModelIdentity kModel{"flat:6", 6, 1};

int64_t Inc(const ParameterShard& shard, int id) {
  for (const WorkerSnapshot& w : shard.Stats().workers) {
    if (w.worker_id == id) return w.incarnation;
  }
  return 0;
}

std::vector<float> Weights(ParameterShard& shard) {
  absl::StatusOr<ParameterShard::Snapshot> s = shard.Read(kModel, -1, 0, 0, absl::Now());
  return std::vector<float>(s->values.span().begin(), s->values.span().end());
}

// Sets every field of `m` (every element twice for a repeated one, nested messages too) to a
// value of its own, none the default, but the tensor list, which the tensors themselves make.
void FillEveryField(google::protobuf::Message* m, int* next) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m->GetReflection();
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    if (f->name() == "tensors") continue;
    for (int copy = 0; copy < (f->is_repeated() ? 2 : 1); ++copy) {
      const int v = ++*next;
      const bool rep = f->is_repeated();
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32:
          rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
          break;
        case FieldDescriptor::CPPTYPE_INT64:  // beyond 2^53: exact, not a JSON double
          rep ? r->AddInt64(m, f, (int64_t{1} << 60) + v)
              : r->SetInt64(m, f, (int64_t{1} << 60) + v);
          break;
        case FieldDescriptor::CPPTYPE_UINT32:
          rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
          break;
        case FieldDescriptor::CPPTYPE_UINT64:
          rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE:
          rep ? r->AddDouble(m, f, v + 0.25) : r->SetDouble(m, f, v + 0.25);
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          rep ? r->AddFloat(m, f, v + 0.25f) : r->SetFloat(m, f, v + 0.25f);
          break;
        case FieldDescriptor::CPPTYPE_BOOL:
          rep ? r->AddBool(m, f, true) : r->SetBool(m, f, true);
          break;
        case FieldDescriptor::CPPTYPE_ENUM: {
          const auto* last = f->enum_type()->value(f->enum_type()->value_count() - 1);
          rep ? r->AddEnum(m, f, last) : r->SetEnum(m, f, last);
          break;
        }
        case FieldDescriptor::CPPTYPE_STRING:
          rep ? r->AddString(m, f, absl::StrCat("text ", v))
              : r->SetString(m, f, absl::StrCat("text ", v));
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          FillEveryField(rep ? r->AddMessage(m, f) : r->MutableMessage(m, f), next);
          break;
      }
    }
  }
}

// The one state schema reaches checkpoints and the backup's state transfer alike: every field of
// proto/shard_state.proto, set by reflection (so a field added to it is covered without a change
// here), comes back from a checkpoint file and from the replication stream's encoding as it was.
TEST(ShardStateTest, EveryFieldOfTheSchemaRoundTripsThroughACheckpointAndTheStateTransfer) {
  ShardState state;
  int next = 0;
  FillEveryField(&state.header, &next);
  const int64_t n = 300'000;  // more than one chunk of the stream
  for (const char* name : {kValuesTensor, "optimizer.momentum", kRoundSumTensor}) {
    std::vector<float>& values = state.AddTensor(name);
    for (int64_t i = 0; i < n; ++i) values.push_back(static_cast<float>(i) * 0.5f + name[0]);
  }
  auto expect_same = [&](const ShardState& got, const std::string& path) {
    v1::ShardState want_header = state.header, got_header = got.header;
    want_header.clear_tensors();  // the file lists its tensors in its own order
    got_header.clear_tensors();
    std::string diff;
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differ.Compare(want_header, got_header)) << path << ": " << diff;
    ASSERT_EQ(got.header.tensors_size(), 3) << path;
    for (const std::string& name : state.header.tensors()) {
      ASSERT_NE(got.Find(name), nullptr) << path << ": " << name;
      EXPECT_EQ(*got.Find(name), *state.Find(name)) << path << ": " << name;
    }
  };

  CheckpointStore store(NewRunDir("checkpoint"), state.header.shard_index(), 1);
  absl::StatusOr<std::string> path = store.Write(state);
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<ShardState> read = ReadShardState(*path);
  ASSERT_TRUE(read.ok()) << read.status();
  expect_same(*read, "checkpoint");

  std::vector<grpc::ByteBuffer> wire;
  auto keep = std::make_shared<int>(0);
  ASSERT_TRUE(WriteState(state, 7, keep, [&](grpc::ByteBuffer b) {
    wire.push_back(std::move(b));
    return true;
  }));
  size_t at = 0;
  auto next_message = [&](v1::ReplicationMessage* m) {
    if (at == wire.size()) return false;
    grpc::Slice flat;
    EXPECT_TRUE(wire[at++].DumpToSingleSlice(&flat).ok());
    return m->ParseFromArray(flat.begin(), static_cast<int>(flat.size()));
  };
  v1::ReplicationMessage first;
  ASSERT_TRUE(next_message(&first));
  absl::StatusOr<ShardState> received = ReadState(first, n, next_message);
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(at, wire.size());
  expect_same(*received, "state transfer");
}

TEST(ShardCheckpointTest, ARestoredShardContinuesBitIdentically) {
  std::unique_ptr<ParameterShard> original = *ParameterShard::Create(AdamSsp());
  ASSERT_TRUE(original->Initialize(kModel, 0, {1, 2, 3, 4, 5, 6}).ok());
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(original->Register(w, kModel).ok());
  for (int64_t s = 0; s < 3; ++s) {
    for (int w = 0; w < 2; ++w) {
      std::vector<float> g = {0.1f * w, -0.2f, 0.3f, s * 0.5f, -1, 2};
      ASSERT_TRUE(original->Push({w, s, original->version(), 0, 6, Inc(*original, w)}, g).ok());
    }
  }
  CheckpointStore store(NewRunDir("checkpoint"), 0, 3);
  ShardState saved;
  ASSERT_TRUE(original->Checkpoint(&saved).ok());
  absl::StatusOr<std::string> path = store.Write(saved);
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<std::optional<ShardState>> loaded = store.LoadNewest();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  std::unique_ptr<ParameterShard> restored = *ParameterShard::Create(AdamSsp());
  ASSERT_TRUE(restored->Restore(**loaded).ok());
  EXPECT_EQ(restored->version(), 6);
  std::vector<float> before = Weights(*original), after = Weights(*restored);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), sizeof(float) * 6), 0);
  // Exactly-once survives: a replayed push is a duplicate; the next is applied, and Adam's state
  // and step make both shards agree to the bit.
  EXPECT_TRUE(
      restored->Push({1, 2, 6, 0, 6, Inc(*restored, 1)}, std::vector<float>(6, 1.0f))->duplicate);
  for (ParameterShard* shard : {original.get(), restored.get()}) {
    absl::StatusOr<PushOutcome> next =
        shard->Push({1, 3, 6, 0, 6, Inc(*shard, 1)}, {1, 1, 1, -1, -1, -1});
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_FALSE(next->duplicate);
  }
  before = Weights(*original);
  after = Weights(*restored);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), sizeof(float) * 6), 0);
  // The bookkeeping came back too: last sequences and SSP clocks.
  EXPECT_EQ(restored->Register(0, kModel)->last_sequence, 2);
  ShardStats stats = restored->Stats();
  ASSERT_EQ(stats.workers.size(), 2u);
  EXPECT_EQ(stats.workers[0].clock, 3);
  EXPECT_EQ(stats.workers[1].clock, 4);
  // A checkpoint of another shard or optimizer is refused.
  ShardConfig momentum = AdamSsp();
  momentum.optimizer.name = "momentum";
  EXPECT_EQ((*ParameterShard::Create(momentum))->Restore(**loaded).code(),
            absl::StatusCode::kInvalidArgument);
  // So is one whose pushes meant something else: gradients (ssp:2) against changes of the model
  // (easgd); another staleness bound is fine.
  ShardConfig easgd = AdamSsp();
  easgd.consistency = "easgd:4";
  EXPECT_NE((*ParameterShard::Create(easgd))->Restore(**loaded).message().find("consistency ssp:2"),
            std::string::npos);
  ShardConfig looser = AdamSsp();
  looser.consistency = "ssp:5";
  EXPECT_TRUE((*ParameterShard::Create(looser))->Restore(**loaded).ok());
}

// A worker registering again with a restarted shard skips the steps lost with it
// (resume_sequence), once; a shard that was not restored, or a second registration, ignores it,
// so no client can push a rank's sequence far ahead at will.
TEST(ShardCheckpointTest, AResumeSequenceIsTakenOnlyOnceAndOnlyByARestoredShard) {
  std::unique_ptr<ParameterShard> original = *ParameterShard::Create(AdamSsp());
  ASSERT_TRUE(original->Initialize(kModel, 0, {1, 2, 3, 4, 5, 6}).ok());
  ASSERT_EQ(original->Register(0, kModel, 500)->last_sequence, -1);  // never restored
  ASSERT_TRUE(original->Push({0, 0, 0, 0, 6, Inc(*original, 0)}, std::vector<float>(6, 1)).ok());
  ShardState saved;
  ASSERT_TRUE(original->Checkpoint(&saved).ok());
  std::unique_ptr<ParameterShard> restored = *ParameterShard::Create(AdamSsp());
  ASSERT_TRUE(restored->Restore(saved).ok());
  EXPECT_EQ(restored->Register(0, kModel, 40)->last_sequence, 39);
  EXPECT_EQ(restored->Register(0, kModel, 900)->last_sequence, 39);
  EXPECT_EQ(restored->Register(1, kModel, 7)->last_sequence, 6);  // joined after the checkpoint
  EXPECT_EQ(restored->Register(2, kModel, ParameterShard::kMaxResumeSequence + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A shard that started empty is checkpointed as soon as it is initialised (not a timed interval
// later: a crash before then would leave a trained job without this shard), then by update count.
TEST(CheckpointerTest, WritesTheInitialisedStateAtOnceThenEveryNUpdates) {
  const std::string dir = NewRunDir("checkpoint");
  absl::StatusOr<std::unique_ptr<Checkpointer>> checkpointer =
      Checkpointer::Open({dir, 3, absl::ZeroDuration(), 2}, 0);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
  ShardConfig config = AdamSsp();
  std::unique_ptr<ParameterShard> shard = *ParameterShard::Create(config);
  shard->SetChangeListener(
      [c = checkpointer->get()](const ShardChange& change) { c->OnUpdate(change.version); });
  absl::StatusOr<Checkpointer::Resumed> resumed = (*checkpointer)->Start(shard.get());
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->version, -1);
  auto newest_version = [&](int64_t want) {
    for (absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;) {
      absl::StatusOr<std::optional<ShardState>> c = CheckpointStore(dir, 0, 3).LoadNewest();
      if (c.ok() && c->has_value() && (*c)->header.version() == want) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  };
  ASSERT_TRUE(shard->Initialize(kModel, 0, {1, 2, 3, 4, 5, 6}).ok());
  EXPECT_TRUE(newest_version(0));
  ASSERT_TRUE(shard->Register(0, kModel).ok());
  for (int64_t s = 0; s < 2; ++s) {
    ASSERT_TRUE(shard->Push({0, s, s, 0, 6, Inc(*shard, 0)}, std::vector<float>(6, 1)).ok());
  }
  EXPECT_TRUE(newest_version(2));
  (*checkpointer)->Stop();
}

// sync: a shard restarted with a round open keeps the round; a worker whose gradient it holds
// and that sends its next step for that round (after registering again) is dropped as late, not
// refused, and the round closes with the others' gradients.
TEST(ShardCheckpointTest, ASyncRoundRestoredOpenClosesAndAWorkerAlreadyInItIsDroppedNotRefused) {
  ShardConfig sync = AdamSsp();
  sync.consistency = "sync";
  sync.num_workers = 2;  // both registered: rounds wait for the job's every worker
  std::unique_ptr<ParameterShard> original = *ParameterShard::Create(sync);
  ASSERT_TRUE(original->Initialize(kModel, 0, {1, 2, 3, 4, 5, 6}).ok());
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(original->Register(w, kModel).ok());
  ASSERT_TRUE(original->Push({0, 0, 0, 0, 6, Inc(*original, 0)}, std::vector<float>(6, 1)).ok());
  ShardState saved;
  ASSERT_TRUE(original->Checkpoint(&saved).ok());
  ASSERT_EQ(std::vector<int>(saved.header.round_contributors().begin(),
                             saved.header.round_contributors().end()),
            std::vector<int>{0});
  std::unique_ptr<ParameterShard> restored = *ParameterShard::Create(sync);
  ASSERT_TRUE(restored->Restore(saved).ok());
  ASSERT_TRUE(restored->Register(0, kModel, 2).ok());
  absl::StatusOr<PushOutcome> again =
      restored->Push({0, 2, 0, 0, 6, Inc(*restored, 0)}, std::vector<float>(6, 5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->dropped);
  EXPECT_EQ(restored->Stats().pushes_dropped_late, 1);
  absl::StatusOr<PushOutcome> closing =
      restored->Push({1, 0, 0, 0, 6, Inc(*restored, 1)}, std::vector<float>(6, 3));
  ASSERT_TRUE(closing.ok()) << closing.status();
  EXPECT_EQ(restored->version(), 1);  // the average of worker 0's restored 1s and worker 1's 3s
  // Past the restored round the usual rule holds again: a second gradient for one round is refused.
  ASSERT_TRUE(restored->Push({0, 3, 1, 0, 6, Inc(*restored, 0)}, std::vector<float>(6, 1)).ok());
  EXPECT_EQ(
      restored->Push({0, 4, 1, 0, 6, Inc(*restored, 0)}, std::vector<float>(6, 1)).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST(ShardCheckpointTest, ATornNewestCheckpointFallsBackToThePreviousAndOnlyKOfThemAreKept) {
  std::string dir = NewRunDir("checkpoint");
  CheckpointStore store(dir, 0, 2);
  std::unique_ptr<ParameterShard> shard = *ParameterShard::Create(AdamSsp());
  ASSERT_TRUE(shard->Initialize(kModel, 0, {1, 2, 3, 4, 5, 6}).ok());
  ShardState c;
  ASSERT_TRUE(shard->Checkpoint(&c).ok());
  v1::WorkerState* worker = c.header.add_workers();  // whose pushes made the versions
  std::vector<std::string> paths;
  for (int64_t v : {10, 20, 30}) {
    c.header.set_version(v);
    worker->set_pushes_applied(v);
    worker->set_clock(v);
    worker->set_last_sequence(v - 1);
    paths.push_back(*store.Write(c));
  }
  EXPECT_FALSE(std::filesystem::exists(paths[0])) << "only the newest 2 are kept";
  std::filesystem::resize_file(paths[2], std::filesystem::file_size(paths[2]) - 3);
  absl::StatusOr<std::optional<ShardState>> newest = store.LoadNewest();
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->header.version(), 20);
}

// The invariants hold for every state the system makes, under each consistency model: a
// primary's, its backup's (which repeats a round's update without its pushes), and a shard's
// restored from a checkpoint and trained on.
TEST(ShardCheckpointTest, EveryStateAPrimaryItsBackupOrARestoredShardHoldsAgreesWithItself) {
  for (const char* consistency : {"async", "ssp:1", "easgd:1", "sync", "local:1"}) {
    SCOPED_TRACE(consistency);
    ShardConfig config = AdamSsp();
    config.consistency = consistency;
    std::unique_ptr<ParameterShard> primary = *ParameterShard::Create(config);
    std::unique_ptr<ParameterShard> backup = *ParameterShard::Create(config);
    primary->SetChangeListener(
        [&](const ShardChange& c) { EXPECT_TRUE(backup->ApplyChange(c).ok()); });
    ASSERT_TRUE(primary->Initialize(kModel, 0, {1, 2, 3, 4, 5, 6}).ok());
    std::unique_ptr<ParameterShard> restored = *ParameterShard::Create(config);
    auto train = [&](ParameterShard& shard, int64_t first_step) {
      for (int w = 0; w < 3; ++w) ASSERT_TRUE(shard.Register(w, kModel).ok());
      for (int64_t s = first_step; s < first_step + 3; ++s) {
        for (int w = 0; w < 3; ++w) {
          ASSERT_TRUE(shard
                          .Push({w, s, shard.version(), 0, 6, Inc(shard, w)},
                                std::vector<float>(6, 0.01f * (w + 1)))
                          .ok());
        }
      }
      // Worker 0 once more: a round left open, or a push applied alone.
      ASSERT_TRUE(shard
                      .Push({0, first_step + 3, shard.version(), 0, 6, Inc(shard, 0)},
                            std::vector<float>(6, 0.02f))
                      .ok());
    };
    train(*primary, 0);
    for (ParameterShard* shard : {primary.get(), backup.get()}) {
      ShardState state;
      ASSERT_TRUE(shard->Checkpoint(&state).ok());
      EXPECT_TRUE(CheckStateInvariants(state).ok()) << CheckStateInvariants(state);
      if (shard == backup.get()) {
        ASSERT_TRUE(restored->Restore(state).ok());
      }
    }
    train(*restored, 10);
    ShardState state;
    ASSERT_TRUE(restored->Checkpoint(&state).ok());
    EXPECT_TRUE(CheckStateInvariants(state).ok()) << CheckStateInvariants(state);
  }
}

// Replaces the one occurrence of `from` in the file at `path` by `to`, as long: the JSON stays
// valid, as after an edit by hand. False if `from` is not there exactly once.
bool Edit(const std::string& path, const std::string& from, const std::string& to) {
  std::string bytes = ReadFile(path);
  const size_t at = bytes.find(from);
  if (at == std::string::npos || bytes.find(from, at + 1) != std::string::npos ||
      from.size() != to.size()) {
    return false;
  }
  bytes.replace(at, from.size(), to);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return true;
}

// Recomputes the file_crc32 of the checkpoint at `path` as docs/checkpoints.md shows (its 8
// digits blanked, zlib's CRC-32 of the whole file), as after an edit by someone who knows the
// format.
void RecomputeChecksum(const std::string& path) {
  std::string bytes = ReadFile(path);
  const std::string key = R"("file_crc32":")";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos) << path;
  bytes.replace(at + key.size(), 8, "00000000");
  const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
  bytes.replace(at + key.size(), 8, absl::StrFormat("%08x", crc));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A checkpoint edited with its checksum recomputed reads back whole, but a state no shard could
// have written (here its version against the pushes its workers applied) is refused like a
// corrupt file: LoadNewest skips it for the previous one, naming the file and the disagreement,
// and Restore (which a backup's state transfer goes through too) refuses it as DATA_LOSS.
TEST(ShardCheckpointTest, ACheckpointWhoseStateDisagreesWithItselfIsRefusedLikeACorruptOne) {
  ShardConfig async = AdamSsp();
  async.consistency = "async";
  std::unique_ptr<ParameterShard> shard = *ParameterShard::Create(async);
  ASSERT_TRUE(shard->Initialize(kModel, 0, {1, 2, 3, 4, 5, 6}).ok());
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(shard->Register(w, kModel).ok());
  const std::string dir = NewRunDir("checkpoint");
  CheckpointStore store(dir, 0, 3);
  ShardState saved;
  std::vector<std::string> paths;
  for (int64_t s = 0; s < 2; ++s) {
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(
          shard->Push({w, s, shard->version(), 0, 6, Inc(*shard, w)}, std::vector<float>(6, 0.5f))
              .ok());
    }
    ASSERT_TRUE(shard->Checkpoint(&saved).ok());
    paths.push_back(*store.Write(saved));  // versions 2 and 4
  }
  ASSERT_TRUE(Edit(paths[1], R"("version":"4")", R"("version":"3")"));
  RecomputeChecksum(paths[1]);
  absl::StatusOr<ShardState> edited = ReadShardState(paths[1]);
  ASSERT_TRUE(edited.ok()) << edited.status();  // the file itself reads back whole
  ASSERT_EQ(edited->header.version(), 3);
  std::string skipped;
  absl::StatusOr<std::optional<ShardState>> newest = store.LoadNewest(&skipped);
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->header.version(), 2);
  EXPECT_EQ(skipped, paths[1] +
                         ": version 3 disagrees with the 4 pushes its workers applied (under "
                         "async each applied push is one update)");
  std::unique_ptr<ParameterShard> restored = *ParameterShard::Create(async);
  EXPECT_EQ(restored->Restore(*edited).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(restored->initialized());

  // The other invariants, each broken in a state the shard wrote: refused the same way.
  ASSERT_TRUE(shard->Checkpoint(&saved).ok());
  ASSERT_TRUE(restored->Restore(saved).ok()) << "the unedited state is fine";
  auto refused = [&](const std::function<void(ShardState*)>& edit, const std::string& says) {
    ShardState state = saved;
    edit(&state);
    std::unique_ptr<ParameterShard> fresh = *ParameterShard::Create(async);
    const absl::Status s = fresh->Restore(state);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << says << ": " << s;
    EXPECT_NE(s.message().find(says), std::string::npos) << s;
  };
  refused([](ShardState* s) { *s->header.add_workers() = s->header.workers(0); },
          "worker 0 is listed twice");
  refused([](ShardState* s) { s->header.mutable_workers(1)->set_clock(1); },
          "worker 1 applied 2 pushes but its clock is 1");
  refused([](ShardState* s) { s->header.mutable_workers(0)->set_joined_at_version(5); },
          "worker 0 joined at version 5, outside [0, 4]");
  refused([](ShardState* s) { s->header.mutable_workers(0)->set_last_sequence(-2); },
          "worker 0 has a last_sequence below -1");
  refused([](ShardState* s) { s->header.add_round_contributors(0); },
          "a round is open under async");
  refused([](ShardState* s) { s->header.set_changes(-1); }, "change count -1 is negative");
}

// Waits until the newest valid checkpoint of shard 0 in `dir` holds `version`.
bool WaitForCheckpoint(const std::string& dir, int64_t version) {
  for (absl::Time end = absl::Now() + absl::Minutes(1); absl::Now() < end;) {
    absl::StatusOr<std::optional<ShardState>> c = CheckpointStore(dir, 0, 3).LoadNewest();
    if (c.ok() && c->has_value() && (*c)->header.version() == version) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// psctl checkpoint's call on the plaintext shard at `address`.
grpc::Status CheckpointNow(const std::string& address, v1::CheckpointResponse* response) {
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return stub->Checkpoint(&context, v1::CheckpointRequest(), response);
}

const ModelIdentity kSmallMlp{"mlp:784-8-10", 784 * 8 + 8 + 8 * 10 + 10, 1};

// Starts one shard of kSmallMlp in `cluster` keeping checkpoints in `checkpoints`, trains it to
// version 4 and stops it with SIGTERM. It writes its initialised state by itself, then only when
// asked (no timed or counted checkpoints): at version 2 by psctl checkpoint's call, at 4 on
// SIGTERM.
void CheckpointAt0And2And4(LocalCluster& cluster, const std::string& checkpoints) {
  ASSERT_TRUE(cluster
                  .StartShards(1, kSmallMlp.fingerprint, 1,
                               {"--checkpoint_dir=" + checkpoints, "--checkpoint_seconds=0"})
                  .ok());
  const std::string address = cluster.ShardAddress(0);
  ShardedClient worker({address}, kSmallMlp, 0);
  ASSERT_TRUE(worker.Register().ok());
  ASSERT_EQ(*worker.Initialize(std::vector<float>(kSmallMlp.total_params, 0.25f)), 1);
  ASSERT_TRUE(WaitForCheckpoint(checkpoints, 0));
  const std::vector<float> gradient(kSmallMlp.total_params, 0.5f);
  for (int64_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(worker.Push(gradient).ok());
    if (step == 1) {
      v1::CheckpointResponse written;
      ASSERT_TRUE(CheckpointNow(address, &written).ok());
      ASSERT_EQ(written.version(), 2);
    }
  }
  cluster.shards()[0].Signal(SIGTERM);
  ASSERT_EQ(*cluster.shards()[0].Wait(absl::Seconds(30)), 0);
}

// A checkpoint changed after it was written, in its metadata (the version, a worker's last
// sequence) or in its tensors, is refused like a torn one: the shard resumes from the newest
// intact one, its log naming the refused file and the checksum, and export takes the same one
// (and, with none left, refuses naming the files).
TEST(CheckpointDaemonTest, ACheckpointChangedInItsHeaderOrItsDataIsRefused) {
  const std::string run_dir = NewRunDir("checkpoint"), checkpoints = run_dir + "/checkpoints";
  LocalCluster cluster(ExecutableDir(), run_dir);
  ASSERT_NO_FATAL_FAILURE(CheckpointAt0And2And4(cluster, checkpoints));
  const std::string address = cluster.ShardAddress(0);  // its port again once restarted
  auto file = [&](int version) {
    return absl::StrFormat("%s/shard-0-%012d.safetensors", checkpoints, version);
  };
  for (int version : {0, 2, 4}) ASSERT_TRUE(ReadShardState(file(version)).ok()) << version;
  auto expect_resumed_from = [&](int64_t version, const std::string& refused) {
    ASSERT_TRUE(cluster.RestartShard(0).ok());
    EXPECT_EQ(Stats(address).resumed_version(), version);
    const std::string log = ReadFile(run_dir + "/ps-0.log");
    EXPECT_NE(log.find(refused + ": checksum mismatch"), std::string::npos) << log;
    cluster.shards()[0].Signal(SIGTERM);
    // Nothing changed since the checkpoint it resumed from: nothing to write, and exit 0.
    ASSERT_EQ(*cluster.shards()[0].Wait(absl::Seconds(30)), 0);
  };

  // The version in the newest one's metadata: would have resumed at version 1.
  ASSERT_TRUE(Edit(file(4), R"("version":"4")", R"("version":"1")"));
  expect_resumed_from(2, file(4));
  absl::StatusOr<ModelFile> exported = ModelFromCheckpoints(checkpoints, kSmallMlp.fingerprint);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->versions, std::vector<int64_t>{2});
  // Worker 0's last sequence (1: its pushes 0 and 1) in the next: would have answered its next
  // pushes "duplicate" without applying them.
  ASSERT_TRUE(Edit(file(2), R"(\"last_sequence\":1)", R"(\"last_sequence\":9)"));
  expect_resumed_from(0, file(2));
  // A bit of the values in the oldest: none left; the shard starts empty, export refuses.
  std::string bytes = ReadFile(file(0));
  bytes.back() ^= 1;
  std::ofstream(file(0), std::ios::binary | std::ios::trunc) << bytes;
  expect_resumed_from(-1, file(0));
  exported = ModelFromCheckpoints(checkpoints, kSmallMlp.fingerprint);
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kNotFound);
  for (int version : {0, 2, 4}) {
    EXPECT_NE(exported.status().message().find(file(version) + ": checksum mismatch"),
              std::string::npos)
        << exported.status();
  }
}

// A checkpoint whose version was edited and its checksum recomputed (docs/checkpoints.md shows
// how) reads back whole but disagrees with the pushes its workers applied: the shard refuses it
// like a corrupt one, resuming from the previous checkpoint with a log line naming the file and
// the disagreement, and export takes the previous one too.
TEST(CheckpointDaemonTest, ACheckpointEditedWithItsChecksumRecomputedIsRefusedIfItDisagrees) {
  const std::string run_dir = NewRunDir("checkpoint"), checkpoints = run_dir + "/checkpoints";
  LocalCluster cluster(ExecutableDir(), run_dir);
  ASSERT_NO_FATAL_FAILURE(CheckpointAt0And2And4(cluster, checkpoints));
  const std::string address = cluster.ShardAddress(0);  // its port again once restarted
  const std::string newest = absl::StrFormat("%s/shard-0-%012d.safetensors", checkpoints, 4);
  ASSERT_TRUE(Edit(newest, R"("version":"4")", R"("version":"1")"));
  RecomputeChecksum(newest);
  ASSERT_TRUE(ReadShardState(newest).ok()) << "the checksum was recomputed";

  ASSERT_TRUE(cluster.RestartShard(0).ok());
  EXPECT_EQ(Stats(address).resumed_version(), 2);
  const std::string log = ReadFile(run_dir + "/ps-0.log");
  EXPECT_NE(log.find(newest + ": version 1 disagrees with the 4 pushes its workers applied"),
            std::string::npos)
      << log;
  absl::StatusOr<ModelFile> exported = ModelFromCheckpoints(checkpoints, kSmallMlp.fingerprint);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->versions, std::vector<int64_t>{2});
  cluster.shards()[0].Signal(SIGTERM);
  ASSERT_EQ(*cluster.shards()[0].Wait(absl::Seconds(30)), 0);
}

// The scrape of the metrics endpoint that `log` (a daemon's, --metrics_port=0) says it serves.
std::string ScrapeLoggedMetrics(const std::string& log, const std::string& dir) {
  const std::string marker = "Prometheus metrics on http://127.0.0.1:";
  int port = 0;
  for (absl::Time end = absl::Now() + absl::Seconds(30); port == 0 && absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(50))) {
    const std::string text = ReadFile(log);
    if (size_t at = text.find(marker); at != std::string::npos) {
      port = std::atoi(text.c_str() + at + marker.size());
    }
  }
  absl::StatusOr<Subprocess> curl = Subprocess::Start(
      {"/usr/bin/curl", "-sf", absl::StrCat("http://127.0.0.1:", port, "/metrics")},
      dir + "/scrape.txt");
  EXPECT_TRUE(curl.ok()) << curl.status();
  EXPECT_EQ(curl.ok() ? *curl->Wait(absl::Seconds(30)) : -1, 0);
  return ReadFile(dir + "/scrape.txt");
}

// A shard whose checkpoints fail says so: GetStats, psctl status and the metrics count the
// failures and name the error, and ps exits 1 when its last checkpoint at SIGTERM fails, with one
// line naming the directory and the error. The directory is replaced after start by a regular
// file of the same name, so that creating a file in it fails (ENOTDIR) even for root, whom
// chmod 0555 would not stop (the tests run as root).
TEST(CheckpointDaemonTest, FailedCheckpointsAreShownAndAFailedLastOneFailsTheExit) {
  const std::string run_dir = NewRunDir("checkpoint"), checkpoints = run_dir + "/checkpoints";
  LocalCluster cluster(ExecutableDir(), run_dir);
  ASSERT_TRUE(cluster
                  .StartShards(1, kSmallMlp.fingerprint, 1,
                               {"--checkpoint_dir=" + checkpoints, "--checkpoint_seconds=0",
                                "--metrics_port=0"})
                  .ok());
  const std::string address = cluster.ShardAddress(0);
  ShardedClient worker({address}, kSmallMlp, 0);
  ASSERT_TRUE(worker.Register().ok());
  ASSERT_EQ(*worker.Initialize(std::vector<float>(kSmallMlp.total_params, 0.25f)), 1);
  // The initialised state's checkpoint, written by the shard by itself.
  v1::StatsResponse stats = Stats(address);
  for (absl::Time end = absl::Now() + absl::Minutes(1);
       stats.checkpoint_last_written_version() != 0 && absl::Now() < end; stats = Stats(address)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(stats.checkpoint_last_written_version(), 0);
  EXPECT_EQ(stats.checkpoint_failures(), 0);
  ASSERT_TRUE(worker.Push(std::vector<float>(kSmallMlp.total_params, 0.5f)).ok());

  std::filesystem::rename(checkpoints, checkpoints + ".moved");
  std::ofstream(checkpoints) << "not a directory\n";
  v1::CheckpointResponse response;
  const grpc::Status refused = CheckpointNow(address, &response);
  EXPECT_FALSE(refused.ok());
  const std::string error =
      "cannot create " + checkpoints + "/shard-0-000000000001.safetensors.tmp: Not a directory";
  EXPECT_NE(refused.error_message().find(error), std::string::npos) << refused.error_message();
  // Nothing else writes (no timed or counted checkpoints): exactly the one failure.
  stats = Stats(address);
  EXPECT_EQ(stats.checkpoint_failures(), 1);
  EXPECT_EQ(stats.checkpoint_last_error(), error);
  EXPECT_EQ(stats.checkpoint_last_written_version(), 0);
  EXPECT_GT(stats.checkpoint_last_written_time(), 1.7e9);  // Unix seconds, after 2023

  absl::StatusOr<Subprocess> psctl = Subprocess::Start(
      {ExecutableDir() + "/psctl", "status", "--ps=" + address, "--hidden=8", "--interval=0.1"},
      run_dir + "/status.log");
  ASSERT_TRUE(psctl.ok()) << psctl.status();
  EXPECT_EQ(*psctl->Wait(absl::Seconds(60)), 0);
  const std::string status = ReadFile(run_dir + "/status.log");
  EXPECT_NE(status.find("shard 0: 1 checkpoint(s) FAILED, the last: " + error +
                        "; the newest written holds version 0 ("),
            std::string::npos)
      << status;

  const std::string metrics = ScrapeLoggedMetrics(run_dir + "/ps-0.log", run_dir);
  auto sample = [&](const std::string& name) {
    const size_t at = metrics.find("\n" + name + "{shard=\"0\"} ");
    return at == std::string::npos ? -1 : std::atof(metrics.c_str() + metrics.find("} ", at) + 2);
  };
  EXPECT_EQ(sample("ps_checkpoint_failures_total"), 1) << metrics;
  EXPECT_EQ(sample("ps_checkpoint_last_success_version"), 0) << metrics;
  EXPECT_GT(sample("ps_checkpoint_last_success_timestamp_seconds"), 1.7e9) << metrics;

  cluster.shards()[0].Signal(SIGTERM);
  EXPECT_EQ(*cluster.shards()[0].Wait(absl::Seconds(30)), 1);
  const std::string log = ReadFile(run_dir + "/ps-0.log");
  EXPECT_NE(log.find("ps: the last checkpoint (version 1) could not be written to " + checkpoints +
                     ": " + error + "; the newest valid one holds version 0\n"),
            std::string::npos)
      << log;
  // The statistics it wrote at exit (--stats_json) count both failures.
  const std::string json = ReadFile(run_dir + "/stats-shard-0.json");
  EXPECT_NE(json.find("\"checkpointFailures\": \"2\""), std::string::npos) << json;
}

TEST(CheckpointDaemonTest, AStoppedShardRestartsFromItsCheckpointAndTheWorkerResumes) {
  const std::string checkpoints = NewRunDir("checkpoint") + "/checkpoints";
  const std::vector<std::string> ps_flags = {"--checkpoint_dir=" + checkpoints, "--optimizer=adam",
                                             "--lr=0.001"};
  const ModelIdentity model{"mlp:784-32-10", 25450, 1};
  std::vector<float> before(model.total_params), after(model.total_params);
  {
    LocalCluster cluster(ExecutableDir(), NewRunDir("checkpoint"));
    ASSERT_TRUE(cluster.StartShards(1, model.fingerprint, 1, ps_flags).ok());
    ASSERT_TRUE(cluster.StartWorker(0, 1, {"--hidden=32", "--steps=100"}).ok());
    ASSERT_EQ(*cluster.worker(0)->Wait(absl::Minutes(3)), 0);
    ShardedClient observer({cluster.ShardAddress(0)}, model, -1);
    absl::StatusOr<ShardedClient::Versions> versions = observer.Pull(absl::MakeSpan(before));
    ASSERT_TRUE(versions.ok());
    EXPECT_EQ(versions->version[0], 100);
    EXPECT_EQ(cluster.Stop(), "");  // SIGTERM: the shard writes its last checkpoint
  }
  LocalCluster cluster(ExecutableDir(), NewRunDir("checkpoint"));
  ASSERT_TRUE(cluster.StartShards(1, model.fingerprint, 1, ps_flags).ok());
  ShardedClient observer({cluster.ShardAddress(0)}, model, -1);
  absl::StatusOr<ShardedClient::Versions> versions = observer.Pull(absl::MakeSpan(after));
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->version[0], 100);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), sizeof(float) * before.size()), 0);
  // The worker, started again, resumes at step 100 and is not re-initialised.
  ASSERT_TRUE(cluster.StartWorker(0, 1, {"--hidden=32", "--steps=150"}).ok());
  ASSERT_EQ(*cluster.worker(0)->Wait(absl::Minutes(3)), 0);
  std::string text = ReadFile(cluster.run_dir() + "/worker-0.log");
  EXPECT_NE(text.find("initialised 0 of 1 shards"), std::string::npos) << text;
  EXPECT_NE(text.find("starting at step 100"), std::string::npos) << text;
  versions = observer.Pull(absl::MakeSpan(after));
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->version[0], 150);
  EXPECT_EQ(cluster.Stop(), "");
}

// psctl checkpoint and export on a live 2-shard job: every shard writes a checkpoint now (once:
// asked again, it says the newest already holds that version), export writes the live model, and
// the checkpoints hold the same model; a shard that keeps no checkpoints says so.
TEST(PsctlTest, CheckpointAndExportALiveJob) {
  const std::string dir = NewRunDir("psctl");
  const ModelIdentity model{"mlp:784-8-10", 784 * 8 + 8 + 8 * 10 + 10, 2};
  LocalCluster cluster(ExecutableDir(), dir);
  ASSERT_TRUE(cluster
                  .StartShards(2, model.fingerprint, 1,
                               {"--checkpoint_dir=" + dir + "/checkpoints", "--lr=0.5"})
                  .ok());
  const std::string ps = cluster.ShardAddress(0) + "," + cluster.ShardAddress(1);
  ShardedClient worker({cluster.ShardAddress(0), cluster.ShardAddress(1)}, model, 0);
  ASSERT_TRUE(worker.Register().ok());
  std::vector<float> values(model.total_params, 0.25f), gradient(model.total_params, 0.5f);
  ASSERT_EQ(*worker.Initialize(values), 2);
  ASSERT_TRUE(worker.Push(gradient).ok());
  ASSERT_TRUE(worker.Pull(absl::MakeSpan(values)).ok());
  auto psctl = [&](std::vector<std::string> args, const std::string& log) {
    args.insert(args.begin(), {ExecutableDir() + "/psctl"});
    args.insert(args.end(), {"--ps=" + ps, "--hidden=8"});
    absl::StatusOr<Subprocess> p = Subprocess::Start(args, dir + "/" + log);
    EXPECT_TRUE(p.ok()) << p.status();
    absl::StatusOr<int> code = p.ok() ? p->Wait(absl::Seconds(60)) : absl::StatusOr<int>(-1);
    EXPECT_TRUE(code.ok()) << code.status();
    return code.ok() ? *code : -1;
  };
  EXPECT_EQ(psctl({"checkpoint"}, "checkpoint.log"), 0) << ReadFile(dir + "/checkpoint.log");
  // Written now, or by the shard's own writer thread a moment before (it checkpoints a shard as
  // soon as it is initialised, and the push may have come first): either way version 1 is there.
  const std::string first = ReadFile(dir + "/checkpoint.log");
  EXPECT_NE(first.find("shard 1 (" + cluster.ShardAddress(1) + "): checkpoint at version 1"),
            std::string::npos)
      << first;
  EXPECT_EQ(psctl({"checkpoint"}, "again.log"), 0);
  EXPECT_NE(ReadFile(dir + "/again.log").find("version 1 (already written)"), std::string::npos)
      << ReadFile(dir + "/again.log");
  EXPECT_EQ(psctl({"export", "--out=" + dir + "/model.safetensors"}, "export.log"), 0)
      << ReadFile(dir + "/export.log");
  absl::StatusOr<ModelFile> exported = ReadModelFile(dir + "/model.safetensors", model.fingerprint);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->params, values);
  EXPECT_EQ(exported->versions, (std::vector<int64_t>{1, 1}));
  absl::StatusOr<ModelFile> checkpointed =
      ModelFromCheckpoints(dir + "/checkpoints", model.fingerprint);
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  EXPECT_EQ(checkpointed->params, values);

  LocalCluster plain(ExecutableDir(), dir + "/plain");
  ASSERT_TRUE(plain.StartShards(1, "mlp:784-8-10", 1, {}).ok());
  absl::StatusOr<Subprocess> refused = Subprocess::Start(
      {ExecutableDir() + "/psctl", "checkpoint", "--ps=" + plain.ShardAddress(0), "--hidden=8"},
      dir + "/refused.log");
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(*refused->Wait(absl::Seconds(60)), 1);
  EXPECT_NE(ReadFile(dir + "/refused.log").find("keeps no checkpoints"), std::string::npos)
      << ReadFile(dir + "/refused.log");
}

}  // namespace
}  // namespace ps
