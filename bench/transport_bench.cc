// transport_bench: push and pull throughput of a real ps shard process over loopback gRPC,
// against three ceilings measured in the same run: single-stream loopback TCP (a real iperf3),
// raw gRPC byte streams of the same 1 MiB chunks to a server that does nothing with them, and
// memcpy of the same number of bytes. The cost of
// replication: pushes over the data plane to a replicated shard (ps --peer: acknowledged once the
// backup applied them) against the same pushes to a lone one ("/plane"). And the 16-bit wire
// (--dtype): the same pushes and pulls with gradients and weights travelling as bf16 or fp16, as
// parameters per second against float32's. And whether striping would pay (issue: a bulk data
// plane): the raw streams split over --stripes connections at once. And the co-located data plane:
// the same pushes and pulls through shared memory (transport/shared_memory.h), against memcpy and
// against the same push and pull made on a ParameterShard in this process (the shard's own work
// with no transport at all: one copy, the scan and the SGD apply for a push; one copy for a pull).
// And the bulk data plane (transport/data_plane.h): pushes and pulls whose tensors go on a TCP
// connection of their own beside the gRPC calls ("plane"), against the TCP ceiling. The other
// columns are gRPC streams. With --tls_dir, every shard and client speaks mutual TLS (gRPC and
// the data plane; the ceilings stay plaintext).
//
//   build/bin/transport_bench --sizes_mib=1,16,64 --repeats=7
//   deploy/make_test_certs.sh /tmp/certs && build/bin/transport_bench --tls_dir=/tmp/certs
#include <grpcpp/create_channel.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/iperf3.h"
#include "bench/median_seconds.h"
#include "bench/raw_bytes.grpc.pb.h"
#include "transport/chunking.h"
#include "transport/security.h"
#include "deploy/local_cluster.h"
#include "deploy/subprocess.h"
#include "nlohmann/json.hpp"
#include "server/state/parameter_shard.h"
#include "client/sharded_client.h"

ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"1", "16", "64"}),
          "Tensor sizes to move, in MiB (fractions too: 0.0625 is 64 KiB).");
ABSL_FLAG(int, repeats, 7, "Timed repetitions per size (the median is reported).");
ABSL_FLAG(std::string, dtype, "bf16", "The 16-bit wire type to compare with float32: bf16 | fp16.");
ABSL_FLAG(std::string, serve_raw, "", "Internal: serve RawBytes and write the port to this file.");
ABSL_FLAG(
    int, tcp_seconds, 3,
    "Seconds of single-stream loopback TCP measured by iperf3 (Debian's) as a ceiling; 0: none.");
ABSL_FLAG(int, raw_chunk_kib, 1024,
          "Message size of the raw streams (the ceiling columns), in KiB: a bulk data plane "
          "candidate (ps.v1 streams 1024).");
ABSL_FLAG(std::string, raw_args, "",
          "gRPC channel arguments for both ends of the raw streams, name=int,... (e.g. "
          "grpc.http2.write_buffer_size=16777216,grpc.http2.lookahead_bytes=67108864): the "
          "other bulk data plane candidate.");
ABSL_FLAG(std::vector<std::string>, ps_flags, {},
          "More flags for every shard started, comma-separated (e.g. --apply_threads=8).");
ABSL_FLAG(std::string, tls_dir, "",
          "Run the shards over mutual TLS, gRPC and the data plane alike, with the files "
          "deploy/make_test_certs.sh writes here (ca.pem, server.pem/.key, client.pem/.key).");
ABSL_FLAG(int, stripes, 2,
          "Raw streams run at once, each on its own connection, for the striped ceiling columns.");

namespace ps {
namespace {

int64_t RawChunkBytes() { return int64_t{absl::GetFlag(FLAGS_raw_chunk_kib)} * 1024; }

// --raw_args as (name, value) pairs; exits on a malformed one.
std::vector<std::pair<std::string, int>> RawChannelArgs() {
  std::vector<std::pair<std::string, int>> args;
  for (absl::string_view arg :
       absl::StrSplit(absl::GetFlag(FLAGS_raw_args), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
    int value = 0;
    if (!absl::SimpleAtoi(kv.second, &value)) {
      std::cerr << "--raw_args: " << arg << " is not name=int\n";
      std::exit(1);
    }
    args.emplace_back(kv.first, value);
  }
  return args;
}

// The raw streams' channel arguments: --raw_args, and messages of any size.
grpc::ChannelArguments RawChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  for (const auto& [name, value] : RawChannelArgs()) args.SetInt(name, value);
  return args;
}

// Receives and discards uploads; serves downloads from one preallocated buffer.
class RawBytesService final : public bench::RawBytes::Service {
 public:
  grpc::Status Upload(grpc::ServerContext*, grpc::ServerReader<bench::Blob>* reader,
                      bench::Ack* ack) override {
    bench::Blob blob;
    int64_t total = 0;
    while (reader->Read(&blob)) total += blob.data().size();
    ack->set_bytes(total);
    return grpc::Status::OK;
  }
  grpc::Status Download(grpc::ServerContext*, const bench::DownloadRequest* request,
                        grpc::ServerWriter<bench::Blob>* writer) override {
    static const std::string chunk(RawChunkBytes(), 'x');
    bench::Blob blob;
    for (int64_t sent = 0; sent < request->bytes(); sent += RawChunkBytes()) {
      blob.set_data(chunk.data(), std::min<int64_t>(RawChunkBytes(), request->bytes() - sent));
      if (!writer->Write(blob)) break;
    }
    return grpc::Status::OK;
  }
};

int ServeRaw(const std::string& port_file) {
  RawBytesService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  for (const auto& [name, value] : RawChannelArgs()) builder.AddChannelArgument(name, value);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  std::ofstream(port_file + ".tmp") << port << "\n";
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  server->Wait();  // until the benchmark kills this process
  return 0;
}

// One raw client stream carrying data[0, bytes) in --raw_chunk_kib messages.
void RawUpload(bench::RawBytes::Stub* stub, const char* data, int64_t bytes) {
  grpc::ClientContext context;
  bench::Ack ack;
  auto writer = stub->Upload(&context, &ack);
  bench::Blob blob;
  for (int64_t sent = 0; sent < bytes; sent += RawChunkBytes()) {
    blob.set_data(data + sent, std::min<int64_t>(RawChunkBytes(), bytes - sent));
    writer->Write(blob);
  }
  writer->WritesDone();
  if (!writer->Finish().ok()) std::abort();
}

// One raw server stream of `bytes`, copied into dst.
void RawDownload(bench::RawBytes::Stub* stub, char* dst, int64_t bytes) {
  grpc::ClientContext context;
  bench::DownloadRequest request;
  request.set_bytes(bytes);
  auto reader = stub->Download(&context, request);
  bench::Blob blob;
  for (int64_t at = 0; reader->Read(&blob); at += blob.data().size()) {
    std::memcpy(dst + at, blob.data().data(), blob.data().size());
  }
  if (!reader->Finish().ok()) std::abort();
}

// fn(stripe, begin, size) for `stripes` equal parts of [0, bytes), each on its own thread.
template <typename Fn>
void Striped(int64_t bytes, int stripes, Fn fn) {
  std::vector<std::thread> threads;
  const int64_t part = (bytes + stripes - 1) / stripes;
  for (int k = 0; k < stripes; ++k) {
    const int64_t begin = std::min(bytes, k * part);
    threads.emplace_back(fn, k, begin, std::min(part, bytes - begin));
  }
  for (std::thread& t : threads) t.join();
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Push and pull throughput of a ps shard over loopback, against TCP, raw gRPC and memcpy.\n"
      "  transport_bench --sizes_mib=1,38 --repeats=7");
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_serve_raw).empty()) return ServeRaw(absl::GetFlag(FLAGS_serve_raw));
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::string dir_pattern = "/tmp/transport-bench-XXXXXX";
  std::string run_dir = mkdtemp(dir_pattern.data());

  // The ceiling: a RawBytes server in its own process, like the shard.
  std::string raw_port_file = run_dir + "/raw.port";
  absl::StatusOr<Subprocess> raw =
      Subprocess::Start({ExecutableDir() + "/transport_bench", "--serve_raw=" + raw_port_file,
                         absl::StrCat("--raw_chunk_kib=", absl::GetFlag(FLAGS_raw_chunk_kib)),
                         "--raw_args=" + absl::GetFlag(FLAGS_raw_args)},
                        run_dir + "/raw.log");
  if (!raw.ok()) return 1;
  const std::string tls_dir = absl::GetFlag(FLAGS_tls_dir);
  const ClusterSecurity security =
      tls_dir.empty() ? ClusterSecurity{} : ClusterSecurity::MutualTls(tls_dir);
  ClientOptions over_shm;  // the client's defaults: shared memory, then the data plane
  if (!tls_dir.empty()) {
    absl::StatusOr<ClientSecurity> credentials =
        LoadClientSecurity({security.client_cert, security.client_key, security.ca}, "");
    if (!credentials.ok()) {
      std::cerr << credentials.status() << "\n";
      return 1;
    }
    over_shm.security = *std::move(credentials);
    std::cout << "shards over mutual TLS (" << tls_dir << "): gRPC and the data plane encrypt\n";
  }
  LocalCluster cluster(ExecutableDir(), run_dir, security);
  int raw_port = 0;
  while (!(std::ifstream(raw_port_file) >> raw_port)) absl::SleepFor(absl::Milliseconds(20));
  auto raw_stub = bench::RawBytes::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", raw_port),
                                grpc::InsecureChannelCredentials(), RawChannelArguments()));
  // Striped: one connection per stripe (channels with equal arguments would share one).
  const int stripes = std::max(1, absl::GetFlag(FLAGS_stripes));
  std::vector<std::unique_ptr<bench::RawBytes::Stub>> stripe_stubs;
  for (int k = 0; k < stripes; ++k) {
    grpc::ChannelArguments args = RawChannelArguments();
    args.SetInt("ps.bench.stripe", k);
    stripe_stubs.push_back(bench::RawBytes::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", raw_port), grpc::InsecureChannelCredentials(), args)));
  }

  absl::StatusOr<WireType> half = ParseWireType(absl::GetFlag(FLAGS_dtype));
  if (!half.ok() || *half == WireType::kFloat32) {
    std::cerr << "--dtype must be bf16 or fp16\n";
    return 1;
  }
  const std::string name = WireTypeName(*half);
  const int tcp_seconds = absl::GetFlag(FLAGS_tcp_seconds);
  absl::StatusOr<int> tcp_port = FreePort();
  absl::StatusOr<double> tcp = tcp_seconds <= 0 ? absl::UnavailableError("--tcp_seconds=0")
                               : !tcp_port.ok()
                                   ? tcp_port.status()
                                   : Iperf3GBs(run_dir, tcp_seconds, "127.0.0.1", *tcp_port);
  std::cout << "single-stream loopback TCP (iperf3, " << tcp_seconds << " s): "
            << (tcp.ok() ? absl::StrFormat("%.2f GB/s", *tcp) : std::string(tcp.status().message()))
            << "\n";
  // Our throughput against the TCP ceiling; "-" without one.
  auto of_tcp = [&](double gbs) { return tcp.ok() ? absl::StrFormat("%.2f", gbs / *tcp) : "-"; };
  std::cout << absl::StrFormat(
      "%-8s | %-10s %-10s %-6s | %-10s %-10s %-6s | %-10s | %-12s %-6s | %-14s %-14s | %-10s "
      "%-10s | %-9s %-9s | %-10s %-8s %-10s %-8s | %-9s %-8s %-9s %-8s | %-11s %-6s %-11s "
      "%-6s\n",
      "size", "push GB/s", "raw up", "ratio", "pull GB/s", "raw down", "ratio", "memcpy",
      "replicated", "/plane", "push " + name + " x", "pull " + name + " x",
      absl::StrCat("up x", stripes), absl::StrCat("down x", stripes), "push/TCP", "pull/TCP",
      "plane push", "/TCP", "plane pull", "/TCP", "shm push", "/memcpy", "shm pull", "/memcpy",
      "in-proc push", "shm/it", "in-proc pull", "shm/it");
  for (const std::string& size_text : absl::GetFlag(FLAGS_sizes_mib)) {
    double mib = 0;
    if (!absl::SimpleAtod(size_text, &mib) || !(mib > 0) || mib > 4096) {
      std::cerr << "--sizes_mib: " << size_text << " is not a size in MiB (above 0, up to 4096)\n";
      return 1;
    }
    const int64_t n = std::max<int64_t>(1, std::llround(mib * (1 << 20)) / sizeof(float));
    const int64_t bytes = n * sizeof(float);
    ModelIdentity model{absl::StrCat("flat:", n), n, 1};
    std::vector<std::string> shard_flags = {"--optimizer=sgd", "--lr=0.001"};
    for (const std::string& flag : absl::GetFlag(FLAGS_ps_flags)) shard_flags.push_back(flag);
    // A new model size needs a new shard.
    cluster.Stop();
    LocalCluster replicated(ExecutableDir(), run_dir + "/replicated", security);
    if (absl::Status s = replicated.StartShards(1, model.fingerprint, 1,
                                                shard_flags, /*replicas=*/2);
        !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    if (absl::Status s =
            cluster.StartShards(1, model.fingerprint, 1, shard_flags);
        !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    ClientOptions over_grpc = over_shm;
    over_grpc.shared_memory = false;
    over_grpc.data_plane = false;
    ShardedClient client({cluster.ShardAddress(0)}, model, 0, over_grpc);
    std::vector<float> params(n, 0.5f), grad(n, 0.001f);
    if (!client.Register().ok() || !client.Initialize(params).ok()) return 1;
    double push = MedianSeconds(repeats, [&] {
      if (!client.Push(grad).ok()) std::abort();
    });
    // Over the data plane, the client's default (the primary's changes go on the backup's).
    ClientOptions over_plane = over_grpc;
    over_plane.data_plane = true;
    ShardedClient replicated_client({replicated.ShardAddress(0)}, model, 0, over_plane);
    if (!replicated_client.Register().ok() || !replicated_client.Initialize(params).ok()) return 1;
    double replicated_push = MedianSeconds(repeats, [&] {
      if (!replicated_client.Push(grad).ok()) std::abort();
    });
    replicated.Stop();
    double pull = MedianSeconds(repeats, [&] {
      if (!client.Pull(absl::MakeSpan(params)).ok()) std::abort();
    });
    // Over the data plane (this client registers as worker 0 again, taking over).
    ShardedClient plane_client({cluster.ShardAddress(0)}, model, 0, over_plane);
    if (!plane_client.Register().ok()) return 1;
    double plane_push = MedianSeconds(repeats, [&] {
      if (!plane_client.Push(grad).ok()) std::abort();
    });
    double plane_pull = MedianSeconds(repeats, [&] {
      if (!plane_client.Pull(absl::MakeSpan(params)).ok()) std::abort();
    });
    ClientOptions half_options = over_grpc;
    half_options.push_type = half_options.pull_type = *half;
    ShardedClient half_client({cluster.ShardAddress(0)}, model, 0, half_options);
    if (!half_client.Register().ok()) return 1;
    double half_push = MedianSeconds(repeats, [&] {
      if (!half_client.Push(grad).ok()) std::abort();
    });
    double half_pull = MedianSeconds(repeats, [&] {
      if (!half_client.Pull(absl::MakeSpan(params)).ok()) std::abort();
    });
    // Through shared memory (this client registers as worker 0 again, taking over).
    ShardedClient shared_client({cluster.ShardAddress(0)}, model, 0, over_shm);
    if (!shared_client.Register().ok()) return 1;
    double shm_push = MedianSeconds(repeats, [&] {
      if (!shared_client.Push(grad).ok()) std::abort();
    });
    double shm_pull = MedianSeconds(repeats, [&] {
      if (!shared_client.Pull(absl::MakeSpan(params)).ok()) std::abort();
    });
    // The same work on a shard in this process: the ceiling of any transport.
    ShardConfig config;
    config.model = model.fingerprint;
    config.optimizer.name = "sgd";
    config.learning_rate.base = 0.001f;
    std::unique_ptr<ParameterShard> local = *ParameterShard::Create(config);
    if (!local->Initialize(model, 0, params).ok() || !local->Register(0, model).ok()) return 1;
    const int64_t incarnation = local->Stats().workers[0].incarnation;
    int64_t local_sequence = 0;
    double local_push = MedianSeconds(repeats, [&] {
      if (!local->Push({0, local_sequence++, 0, 0, n, incarnation}, grad).ok()) std::abort();
    });
    double local_pull = MedianSeconds(repeats, [&] {
      if (!local->Read(model, 0, 0, 0, absl::InfiniteFuture()).ok()) std::abort();
    });
    local.reset();
    std::string payload(bytes, 'x');
    double raw_up =
        MedianSeconds(repeats, [&] { RawUpload(raw_stub.get(), payload.data(), bytes); });
    double raw_down =
        MedianSeconds(repeats, [&] { RawDownload(raw_stub.get(), payload.data(), bytes); });
    double striped_up = MedianSeconds(repeats, [&] {
      Striped(bytes, stripes, [&](int k, int64_t begin, int64_t size) {
        RawUpload(stripe_stubs[k].get(), payload.data() + begin, size);
      });
    });
    double striped_down = MedianSeconds(repeats, [&] {
      Striped(bytes, stripes, [&](int k, int64_t begin, int64_t size) {
        RawDownload(stripe_stubs[k].get(), payload.data() + begin, size);
      });
    });
    std::string copy(bytes, 'y');
    double memcpy_s =
        MedianSeconds(repeats, [&] { std::memcpy(copy.data(), payload.data(), bytes); });
    auto gbs = [&](double s) { return bytes / s / 1e9; };
    std::cout << absl::StrFormat(
        "%5g MiB | %-10.2f %-10.2f %-6.2f | %-10.2f %-10.2f %-6.2f | %-10.2f | %-12.2f %-6.2f | "
        "%-14.2f %-14.2f | %-10.2f %-10.2f | %-9s %-9s | %-10.2f %-8s %-10.2f %-8s | %-9.2f %-8.2f "
        "%-9.2f %-8.2f | %-11.2f %-6.2f %-11.2f %-6.2f\n",
        mib, gbs(push), gbs(raw_up), raw_up / push, gbs(pull), gbs(raw_down), raw_down / pull,
        gbs(memcpy_s), gbs(replicated_push), plane_push / replicated_push, push / half_push,
        pull / half_pull, gbs(striped_up), gbs(striped_down), of_tcp(gbs(push)), of_tcp(gbs(pull)),
        gbs(plane_push), of_tcp(gbs(plane_push)), gbs(plane_pull), of_tcp(gbs(plane_pull)),
        gbs(shm_push), memcpy_s / shm_push, gbs(shm_pull), memcpy_s / shm_pull, gbs(local_push),
        local_push / shm_push, gbs(local_pull), local_pull / shm_pull);
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
