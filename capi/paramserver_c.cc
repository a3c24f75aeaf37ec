// The C API (paramserver_c.h) over ShardedClient, WorkerSession, OverlapSchedule and
// LocalExchange: settings as JSON (read by client/client_settings.h), error reporting through a
// thread-local message, and operations as Pending calls.
#include "capi/paramserver_c.h"

#include <google/protobuf/util/json_util.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client_settings.h"
#include "client/local_exchange.h"
#include "client/local_model.h"
#include "client/overlap_schedule.h"
#include "client/sharded_client.h"
#include "client/worker_session.h"
#include "common/consistency_spec.h"
#include "common/log.h"
#include "common/version.h"
#include "nlohmann/json.hpp"
#include "proto/ps.pb.h"

struct ps_client {
  std::unique_ptr<ps::ShardedClient> client;
  absl::Duration heartbeat;
  std::unique_ptr<ps::WorkerSession> session;  // after register; destroyed before the client
};

struct ps_op {
  bool is_pull = false;
  ps::ShardedClient::Pending<ps::ShardedClient::Versions> pull;
  ps::ShardedClient::Pending<ps::ShardedClient::PushSummary> push;
  std::optional<absl::Status> result;  // once ended
  ps::ShardedClient::Versions versions;
  ps::ShardedClient::PushSummary summary;
};

struct ps_step {
  std::unique_ptr<ps::OverlapSchedule> schedule;
  bool pushing = false;  // the push was started and not taken yet
};

struct ps_exchange {
  std::unique_ptr<ps::LocalModel> model;  // over the caller's values; its optimizer is the caller's
  std::unique_ptr<ps::LocalExchange> exchange;
  std::optional<absl::Status> result;  // of the exchange started last, once it ended
};

namespace {

thread_local std::string last_error;

int Report(const absl::Status& status) {
  last_error = std::string(status.message());
  return static_cast<int>(status.code());
}

int Ok() {
  last_error.clear();
  return 0;
}

// A person may be waiting on this library's calls (the Python package): a wrong address fails
// soon (client/client_settings.h).
ps::SettingsUse Use() {
  ps::SettingsUse use;
  use.kind = ps::ClientKind::kInteractive;
  return use;
}

absl::StatusOr<std::unique_ptr<ps_client>> MakeClient(const char* settings_json) {
  absl::StatusOr<ps::SettingTexts> settings =
      ps::SettingsFromJson(settings_json == nullptr ? "{}" : settings_json);
  if (!settings.ok()) return settings.status();
  absl::StatusOr<ps::ClientConnection> c =
      ps::ClientConnectionFromSettings(*std::move(settings), Use());
  if (!c.ok()) return c.status();
  auto client = std::make_unique<ps_client>();
  client->heartbeat = c->heartbeat;
  client->client = std::make_unique<ps::ShardedClient>(std::move(c->addresses), c->identity,
                                                       c->rank, std::move(c->options));
  return client;
}

// A wait's answer: 0, PS_NOT_DONE while `s` is nullopt, else s's code.
int Waited(const std::optional<absl::Status>& s) {
  if (!s.has_value()) {
    last_error = "in progress";
    return PS_NOT_DONE;
  }
  return s->ok() ? Ok() : Report(*s);
}

absl::Duration Timeout(double seconds) {
  return seconds < 0 ? absl::InfiniteDuration() : absl::Seconds(seconds);
}

// Records `op`'s result once its call ended (waiting up to `timeout` for it).
void Settle(ps_op* op, absl::Duration timeout) {
  if (op->result.has_value()) return;
  if (op->is_pull) {
    // Waited for (not polled): the parts still held go at once, as at Pending::Wait.
    if (timeout != absl::ZeroDuration()) op->pull.SendAll();
    if (!op->pull.Done(timeout)) return;
    absl::StatusOr<ps::ShardedClient::Versions> v = op->pull.Wait();
    op->result = v.status();
    if (v.ok()) op->versions = *std::move(v);
  } else {
    if (!op->push.Done(timeout)) return;
    absl::StatusOr<ps::ShardedClient::PushSummary> s = op->push.Wait();
    op->result = s.status();
    if (s.ok()) op->summary = *s;
  }
}

absl::Status CheckCount(const ps_client* client, int64_t count, const char* what) {
  if (count != client->client->model().total_params) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", count, " values; the model has ",
                                                   client->client->model().total_params));
  }
  return absl::OkStatus();
}

// Proto3's JSON mapping writes 64-bit integers as strings (JavaScript's numbers hold 53 bits);
// this API gives every number as a number. Turns the int64 fields of `message` (and of the
// messages it holds) in `json`, its JSON with the proto's field names, into numbers.
void Int64sAsNumbers(const google::protobuf::Descriptor& message, nlohmann::json* json) {
  using google::protobuf::FieldDescriptor;
  for (int i = 0; i < message.field_count(); ++i) {
    const FieldDescriptor& field = *message.field(i);
    auto found = json->find(field.name());
    if (found == json->end()) continue;
    auto convert = [&field](nlohmann::json& value) {
      int64_t number = 0;
      if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        Int64sAsNumbers(*field.message_type(), &value);
      } else if (field.cpp_type() == FieldDescriptor::CPPTYPE_INT64 && value.is_string() &&
                 absl::SimpleAtoi(value.get<std::string>(), &number)) {
        value = number;
      }
    };
    if (field.is_repeated()) {
      for (nlohmann::json& value : *found) convert(value);
    } else {
      convert(*found);
    }
  }
}

}  // namespace

extern "C" {

int ps_api_version(void) { return PS_C_API_VERSION; }

const char* ps_version(void) {
  static const std::string* const kLine = new std::string(ps::VersionLine());
  return kLine->c_str();
}

const char* ps_last_error(void) { return last_error.c_str(); }

void ps_set_log_sink(ps_log_sink sink, void* arg) {
  if (sink == nullptr) {
    ps::SetLogSink(nullptr);
    return;
  }
  ps::SetLogSink([sink, arg](ps::LogLevel level, const std::string& message) {
    sink(static_cast<int>(level), message.c_str(), arg);
  });
}

const char* ps_setting_names(void) {
  static const std::string* const kNames =
      new std::string(absl::StrJoin(ps::ClientSettingNames(), ","));
  return kNames->c_str();
}

int ps_client_create(const char* settings_json, ps_client** out) {
  static std::once_flag tagged;  // the tag is read by every client's threads: set it once
  std::call_once(tagged, [] { ps::SetLogTag("paramserver"); });
  absl::StatusOr<std::unique_ptr<ps_client>> client = MakeClient(settings_json);
  if (!client.ok()) return Report(client.status());
  *out = client->release();
  return Ok();
}

void ps_client_destroy(ps_client* client) {
  if (client == nullptr) return;
  client->session.reset();  // stops heartbeats, leaves
  client->client->Close();
  delete client;
}

void ps_client_cancel_pending(ps_client* client) { client->client->CancelPending(); }

int ps_client_register(ps_client* client, int64_t* first_step) {
  if (client->session != nullptr) {
    return Report(absl::FailedPreconditionError("this client registered already"));
  }
  absl::StatusOr<std::unique_ptr<ps::WorkerSession>> session =
      ps::WorkerSession::Start(client->client.get(), client->heartbeat);
  if (!session.ok()) return Report(session.status());
  client->session = *std::move(session);
  if (first_step != nullptr) *first_step = client->session->first_step();
  return Ok();
}

int64_t ps_client_total_params(const ps_client* client) {
  return client->client->model().total_params;
}

int ps_client_num_shards(const ps_client* client) { return client->client->num_shards(); }

int ps_client_rank(const ps_client* client) { return client->client->worker_id(); }

const char* ps_client_consistency(const ps_client* client) {
  return client->client->consistency().c_str();
}

int ps_client_initialize(ps_client* client, const float* values, int64_t count, int* taken) {
  if (absl::Status s = CheckCount(client, count, "the initial values"); !s.ok()) return Report(s);
  absl::StatusOr<int> n = client->client->Initialize(absl::MakeConstSpan(values, count));
  if (!n.ok()) return Report(n.status());
  if (taken != nullptr) *taken = *n;
  return Ok();
}

int ps_client_pull(ps_client* client, float* values, int64_t count, int prefetch, ps_op** op) {
  if (absl::Status s = CheckCount(client, count, "the pull's buffer"); !s.ok()) return Report(s);
  auto pending = std::make_unique<ps_op>();
  pending->is_pull = true;
  pending->pull = client->client->StartPull(absl::MakeSpan(values, count), prefetch != 0);
  *op = pending.release();
  return Ok();
}

int ps_client_shard_range(const ps_client* client, int shard, int64_t* begin, int64_t* end) {
  if (shard < 0 || shard >= client->client->num_shards()) {
    return Report(absl::OutOfRangeError(
        absl::StrCat("no shard ", shard, ": there are ", client->client->num_shards())));
  }
  const ps::Range r = client->client->shard_range(shard);
  *begin = r.begin;
  *end = r.end;
  return Ok();
}

int ps_client_push(ps_client* client, const float* gradient, int64_t count, int64_t sequence,
                   int held, ps_op** op) {
  if (absl::Status s = CheckCount(client, count, "the gradient"); !s.ok()) return Report(s);
  if (client->client->worker_id() < 0) {
    return Report(absl::FailedPreconditionError("an observer (rank -1) cannot push"));
  }
  auto pending = std::make_unique<ps_op>();
  pending->push = client->client->StartPush(
      absl::MakeConstSpan(gradient, count),
      sequence < 0 ? ps::ShardedClient::kNextSequence : sequence,
      held != 0 ? ps::ShardedClient::Parts::kHeld : ps::ShardedClient::Parts::kAllNow);
  *op = pending.release();
  return Ok();
}

int ps_op_send(ps_op* op, int shard) {
  if (op->is_pull) return Report(absl::FailedPreconditionError("a pull has no parts to send"));
  if (shard < 0) {
    op->push.SendAll();
  } else {
    op->push.Send(shard);
  }
  return Ok();
}

int ps_op_wait(ps_op* op, double timeout_seconds) {
  Settle(op, Timeout(timeout_seconds));
  return Waited(op->result);
}

int ps_op_filled(ps_op* op, int64_t from) {
  if (op->is_pull) return Report(absl::FailedPreconditionError("a pull has no gradient to fill"));
  op->push.Filled(from);
  return Ok();
}

int ps_op_wait_part(ps_op* op, int shard, double timeout_seconds) {
  if (op->result.has_value()) return op->result->ok() ? Ok() : Report(*op->result);
  const absl::Duration timeout = Timeout(timeout_seconds);
  return Waited(op->is_pull ? op->pull.WaitPart(shard, timeout)
                            : op->push.WaitPart(shard, timeout));
}

int ps_op_wait_values(ps_op* op, int64_t begin, int64_t end, double timeout_seconds) {
  if (op->result.has_value()) return op->result->ok() ? Ok() : Report(*op->result);
  if (!op->is_pull) return Report(absl::FailedPreconditionError("not a pull"));
  return Waited(op->pull.WaitValues(begin, end, Timeout(timeout_seconds)));
}

int ps_op_versions(const ps_op* op, int64_t* versions, int num_shards) {
  if (!op->is_pull || !op->result.has_value() || !op->result->ok()) {
    return Report(absl::FailedPreconditionError("not a pull that succeeded"));
  }
  if (num_shards != static_cast<int>(op->versions.version.size())) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
        "room for ", num_shards, " versions; there are ", op->versions.version.size())));
  }
  std::memcpy(versions, op->versions.version.data(), sizeof(int64_t) * num_shards);
  return Ok();
}

int ps_op_push_summary(const ps_op* op, ps_push_summary* out) {
  if (op->is_pull || !op->result.has_value() || !op->result->ok()) {
    return Report(absl::FailedPreconditionError("not a push that succeeded"));
  }
  const ps::ShardedClient::PushSummary& s = op->summary;
  *out = {s.sequence, s.max_staleness, s.duplicates, s.dropped, s.saturated};
  return Ok();
}

void ps_op_free(ps_op* op) { delete op; }

int ps_client_step(ps_client* client, float* weights, const float* gradient, int64_t count,
                   int prefetch, ps_step** out) {
  if (absl::Status s = CheckCount(client, count, "the step's buffers"); !s.ok()) return Report(s);
  if (client->client->worker_id() < 0) {
    return Report(absl::FailedPreconditionError("an observer (rank -1) cannot push"));
  }
  auto step = std::make_unique<ps_step>();
  step->schedule = std::make_unique<ps::OverlapSchedule>(
      client->client.get(),
      client->client->StartPull(absl::MakeSpan(weights, count), prefetch != 0),
      absl::MakeConstSpan(gradient, count));
  *out = step.release();
  return Ok();
}

int ps_step_weights_needed(ps_step* step, int64_t begin, int64_t end, double timeout_seconds) {
  return Waited(step->schedule->WeightsNeeded(begin, end, Timeout(timeout_seconds)));
}

int ps_step_wait_pull(ps_step* step, double timeout_seconds) {
  return Waited(step->schedule->WaitPull(Timeout(timeout_seconds)));
}

int ps_step_gradient_final(ps_step* step, int64_t begin, int64_t end) {
  if (!step->schedule->pulled()) {
    return Report(absl::FailedPreconditionError("the step's pull was not waited for"));
  }
  if (absl::Status s = step->schedule->GradientFinal(begin, end); !s.ok()) return Report(s);
  step->pushing = true;
  return Ok();
}

int ps_step_final(const ps_step* step, int64_t begin, int64_t end) {
  return step->schedule->Final(begin, end) ? 1 : 0;
}

int64_t ps_step_filled_from(const ps_step* step) { return step->schedule->filled_from(); }

int ps_step_take_push(ps_step* step, ps_op** push) {
  if (!step->pushing) return Report(absl::FailedPreconditionError("the step started no push"));
  auto pending = std::make_unique<ps_op>();
  pending->push = step->schedule->TakePush();
  step->pushing = false;
  *push = pending.release();
  return Ok();
}

void ps_step_free(ps_step* step) { delete step; }

int ps_client_local_models(const ps_client* client) {
  absl::StatusOr<ps::ConsistencySpec> spec =
      ps::ParseConsistencySpec(client->client->consistency());
  return spec.ok() && spec->local_models() ? 1 : 0;
}

int ps_client_exchange(ps_client* client, float* values, int64_t count, ps_exchange** out) {
  if (absl::Status s = CheckCount(client, count, "the local model"); !s.ok()) return Report(s);
  auto exchange = std::make_unique<ps_exchange>();
  exchange->model = std::make_unique<ps::LocalModel>(absl::MakeSpan(values, count), 0.0f);
  absl::StatusOr<std::unique_ptr<ps::LocalExchange>> e =
      ps::LocalExchange::Create(client->client.get(), exchange->model.get());
  if (!e.ok()) return Report(e.status());
  exchange->exchange = *std::move(e);
  exchange->result = absl::OkStatus();
  *out = exchange.release();
  return Ok();
}

int ps_exchange_before_step(ps_exchange* exchange, int64_t step) {
  if (absl::Status s = exchange->exchange->StartBeforeStep(step); !s.ok()) return Report(s);
  exchange->result.reset();
  return Ok();
}

int ps_exchange_after_step(ps_exchange* exchange, int64_t step, int last) {
  if (absl::Status s = exchange->exchange->StartAfterStep(step, last != 0); !s.ok()) {
    return Report(s);
  }
  exchange->result.reset();
  return Ok();
}

int ps_exchange_wait(ps_exchange* exchange, double timeout_seconds) {
  if (!exchange->result.has_value()) {
    exchange->result = exchange->exchange->Wait(Timeout(timeout_seconds));
  }
  return Waited(exchange->result);
}

void ps_exchange_free(ps_exchange* exchange) { delete exchange; }

int ps_client_stats_json(ps_client* client, char** json) {
  absl::StatusOr<std::vector<ps::v1::StatsResponse>> stats = client->client->Stats();
  if (!stats.ok()) return Report(stats.status());
  nlohmann::json out = nlohmann::json::array();
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  for (const ps::v1::StatsResponse& shard : *stats) {
    std::string one;
    if (!google::protobuf::util::MessageToJsonString(shard, &one, options).ok()) {
      return Report(absl::InternalError("statistics do not convert to JSON"));
    }
    out.push_back(nlohmann::json::parse(one));
    Int64sAsNumbers(*shard.GetDescriptor(), &out.back());
  }
  *json = strdup(out.dump().c_str());
  return Ok();
}

void ps_string_free(char* s) { std::free(s); }

}  // extern "C"
