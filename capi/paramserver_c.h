/* The parameter servers' client as a C API (libparamserver_c.so), for languages that load C
 * libraries: the Python package (python/paramserver) loads it through ctypes, which depends on no
 * interpreter's ABI, so one build serves every Python version. It wraps the C++ client
 * (client/sharded_client.h) and a worker's session (client/worker_session.h): the same protocol,
 * retries, TLS, tokens, shared memory and wire types as the C++ daemons.
 *
 * Errors: a function returning int returns 0 on success, else an absl::StatusCode (1-16: 3
 * INVALID_ARGUMENT, 9 FAILED_PRECONDITION, 14 UNAVAILABLE, ...), and ps_last_error() gives that
 * error's message on the calling thread. A failed call changes nothing it was given.
 *
 * Threads: a client may be used from several threads, but start pushes from one (their sequences
 * follow the order they start). No function keeps a caller's thread longer than the client's
 * deadlines and retry budget; ps_op_wait takes a timeout so that callers can stay responsive.
 *
 * Memory: the caller's buffers are read or written in place (no copy) until the operation that
 * uses them ends: keep them alive until ps_op_wait returned something other than PS_NOT_DONE, or
 * until ps_op_free, which waits for the call.
 */
#ifndef PARAMSERVER_C_H_
#define PARAMSERVER_C_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PS_C_API_VERSION 8
#define PS_EXPORT __attribute__((visibility("default")))
#define PS_NOT_DONE (-1) /* ps_op_wait: the call is still in progress */

typedef struct ps_client ps_client;
typedef struct ps_op ps_op;             /* a pull or push in progress */
typedef struct ps_exchange ps_exchange; /* a local model's exchange with the centre */
typedef struct ps_step ps_step;         /* a step's pull and push around its compute */

/* This library's PS_C_API_VERSION, for a loader to check. */
PS_EXPORT int ps_api_version(void);
/* The build this library is, as every program's --version prints it:
 * "paramserver 1.3.0 (3a22abf, Release, CUDA on)" (release, git commit, build type, CUDA backend).
 * Static storage. Since version 8. */
PS_EXPORT const char* ps_version(void);
/* The message of the last error on this thread ("" after success); valid until this thread's next
 * call of this library. */
PS_EXPORT const char* ps_last_error(void);

/* Where the library's log lines go instead of stderr (the Python package hands them to its
 * "paramserver" logger): sink(level, message, arg) on the thread that logs, level 0 info,
 * 1 warning, 2 error, the message without time or level (valid during the call only); the sink
 * must not call this library. NULL: stderr again. Returns once the calls of the sink it replaces
 * have returned. */
typedef void (*ps_log_sink)(int level, const char* message, void* arg);
PS_EXPORT void ps_set_log_sink(ps_log_sink sink, void* arg);

/* The names of the settings ps_client_create takes, comma-separated ("cluster,compress,..."); the
 * string lives as long as the library. */
PS_EXPORT const char* ps_setting_names(void);

/* Makes a client from a JSON object of settings (the C++ daemons' flags of the same names; a
 * number or boolean may also come as its text, "0.5", "true"; null or "": unset):
 *   "ps": "h1:50051,h2:50051"     the shards in order ("a/b": a shard's two replicas), or
 *   "cluster": "job.json"         a cluster spec: shards, model, workers, security from it
 *   "model": "mlp:784-128-10"     the model spec the shards hold (also flat:N, cnn:..., presets,
 *                                 a tensor layout: JSON text or a file F.json)
 *   "rank": 0                     this worker's rank; -1 (default): an observer, pull only
 *   "num_workers": 4              checked against the shards' (0: not checked)
 *   "tls_ca", "tls_cert", "tls_key", "token_file"   credentials (token: else $PS_TOKEN)
 *   "push_dtype", "pull_dtype"    "fp32" (default), "bf16", "fp16"
 *   "compress": "none"            pushes compressed instead: "onebit", "topk:F", "int8"
 *   "error_feedback": true        with "compress": what it leaves out goes with the next push
 *   "pull_compress": "none"       a worker's pulls compressed too (the change since its last
 *                                 pull, over gRPC): "onebit", "topk:F", "int8"
 *   "shared_memory": true         tensors through shared memory with shards on this host
 *   "data_plane": true            tensors over the data plane with shards on other hosts
 *   "rpc_timeout_seconds": 10, "heartbeat_seconds": 1
 *   "retry_seconds": 60           how long a failing call to a shard is retried; when unset, a
 *                                 shard this client never reached (a wrong address) is given up
 *                                 after 10 s, one it reached (maybe restarting) after 60 s
 * Connects lazily: nothing is called before ps_client_register. */
PS_EXPORT int ps_client_create(const char* settings_json, ps_client** out);
/* Leaves the job (a worker that registered), stops heartbeats, ends calls in progress with
 * CANCELLED and frees the client. Operations still open stay valid until freed. */
PS_EXPORT void ps_client_destroy(ps_client* client);

/* Ends the calls in progress (and their retries) with CANCELLED; later calls work as usual. For
 * another thread that wants a blocked call back now (before ps_client_destroy). */
PS_EXPORT void ps_client_cancel_pending(ps_client* client);

/* Registers with every shard (a worker then sends heartbeats on a thread of the client's);
 * *first_step: the step to start or resume at. */
PS_EXPORT int ps_client_register(ps_client* client, int64_t* first_step);
PS_EXPORT int64_t ps_client_total_params(const ps_client* client);
PS_EXPORT int ps_client_num_shards(const ps_client* client);
/* This client's "rank"; -1: an observer. */
PS_EXPORT int ps_client_rank(const ps_client* client);
/* The shards' consistency model ("async", "ssp:3", "sync", "easgd:...", "local:..."), known after
 * register; the string lives as long as the client. */
PS_EXPORT const char* ps_client_consistency(const ps_client* client);
/* Offers initial values (total_params floats) to every shard; *taken: how many shards took them
 * (those already initialised keep theirs). */
PS_EXPORT int ps_client_initialize(ps_client* client, const float* values, int64_t count,
                                   int* taken);

/* Starts a pull of all total_params weights into `values` (count floats); `prefetch`: the pull is
 * of the next step's weights, made before this step's push has landed. */
PS_EXPORT int ps_client_pull(ps_client* client, float* values, int64_t count, int prefetch,
                             ps_op** op);
/* Shard `shard`'s range [*begin, *end) of the flat vector: its part of every pull and push. */
PS_EXPORT int ps_client_shard_range(const ps_client* client, int shard, int64_t* begin,
                                    int64_t* end);
/* Starts a push of `gradient` (count floats), computed from the weights of the last pull waited
 * for; `sequence` < 0: the client's next. `held` != 0: the push takes its sequence now but sends
 * each shard its part only at ps_op_send (its range of `gradient` is final then: a backward pass
 * fills in the last layers first); it is in progress until every part was sent and answered,
 * and freeing the op first sends none of the parts left (they end CANCELLED). */
PS_EXPORT int ps_client_push(ps_client* client, const float* gradient, int64_t count,
                             int64_t sequence, int held, ps_op** op);
/* Sends shard `shard`'s part of a push started held (shard < 0: every part still held); nothing
 * for a part sent already. */
PS_EXPORT int ps_op_send(ps_op* op, int shard);
/* A push started held whose gradient a backward pass fills in from its end: values [from, count)
 * are final now (`from` only goes down). A part whose range is all final is sent, as at
 * ps_op_send; one with final values starts already where its shard takes a push's values as they
 * come (a data-plane call, float32, uncompressed), its values going out as they become final. */
PS_EXPORT int ps_op_filled(ps_op* op, int64_t from);
/* Waits up to `timeout_seconds` (< 0: until it ends) for an operation: 0 once it succeeded,
 * PS_NOT_DONE if it is still in progress, else its error (the same error on every later wait).
 * A pull's parts still held (where hosts hold several shards, each host's go one after another)
 * all go at once, unless `timeout_seconds` is 0 (a poll). */
PS_EXPORT int ps_op_wait(ps_op* op, double timeout_seconds);
/* Waits up to `timeout_seconds` (< 0: until it ends) for shard `shard`'s part of an operation,
 * the others going on: 0 once that part succeeded (a pull's part is then in `values`: a forward
 * pass may start on the first layers' weights), PS_NOT_DONE while it is in progress, else its
 * error. A held push's part is sent first. After the operation ended (ps_op_wait): what it
 * ended with. */
PS_EXPORT int ps_op_wait_part(ps_op* op, int shard, double timeout_seconds);
/* Waits up to `timeout_seconds` (< 0: until they are in) for a pull's values [begin, end) of
 * `values`, the rest going on: 0 once they are in place (each shard's part arrives from its start,
 * so a forward pass may start on a layer's weights before its shard's whole part is in),
 * PS_NOT_DONE while they are still coming, else the error of a part that failed first. Values used
 * so are kept: should the attempt that brought them fail, the pull ends ABORTED instead of being
 * tried again (compute again on a new pull). After the operation ended: what it ended with. */
PS_EXPORT int ps_op_wait_values(ps_op* op, int64_t begin, int64_t end, double timeout_seconds);
/* After a successful pull: the version each shard served (num_shards values). */
PS_EXPORT int ps_op_versions(const ps_op* op, int64_t* versions, int num_shards);
/* After a successful push: its sequence, largest staleness over shards, shards that answered
 * duplicate or dropped it, and gradient values beyond the wire type's range. */
typedef struct {
  int64_t sequence;
  int64_t max_staleness;
  int32_t duplicates;
  int32_t dropped;
  int64_t saturated;
} ps_push_summary;
PS_EXPORT int ps_op_push_summary(const ps_op* op, ps_push_summary* out);
/* Waits for the operation if it is still in progress, then frees it. */
PS_EXPORT void ps_op_free(ps_op* op);

/* A training step whose pull and push overlap its compute (client/overlap_schedule.h), for a
 * framework's hooks: the forward pass waits for each layer's weights as it reaches them, backward
 * sends each shard its part of the gradient as it becomes final. Use one from one thread at a
 * time, and free it before the client.
 * ps_client_step starts the step's pull into `weights` (`prefetch` as at ps_client_pull); its
 * push will send `gradient` (both count = total_params floats, used in place until the push
 * taken from it ended, or ps_step_free). */
PS_EXPORT int ps_client_step(ps_client* client, float* weights, const float* gradient,
                             int64_t count, int prefetch, ps_step** out);
/* The forward pass needs the weights [begin, end): waits up to `timeout_seconds` (< 0: until they
 * are in) as ps_op_wait_values does: 0, PS_NOT_DONE, or the pull's error (ABORTED: compute again
 * on a new step). */
PS_EXPORT int ps_step_weights_needed(ps_step* step, int64_t begin, int64_t end,
                                     double timeout_seconds);
/* The forward pass is over: waits up to `timeout_seconds` for the whole pull (its versions are the
 * push's base): 0, PS_NOT_DONE, or its error. */
PS_EXPORT int ps_step_wait_pull(ps_step* step, double timeout_seconds);
/* Backward made the gradient [begin, end) final (in any order): the first call starts the push
 * with its parts held; each shard's part goes once its range is all final, or piece by piece as
 * the final values reaching the gradient's end grow (ps_op_filled). FAILED_PRECONDITION before
 * ps_step_wait_pull returned 0. */
PS_EXPORT int ps_step_gradient_final(ps_step* step, int64_t begin, int64_t end);
/* 1 if any of the gradient [begin, end) was made final in this step (a second backward would
 * write into what is being pushed), else 0. */
PS_EXPORT int ps_step_final(const ps_step* step, int64_t begin, int64_t end);
/* Where the final values reaching the gradient's end start, as the push was told (ps_op_filled);
 * total_params while none do. */
PS_EXPORT int64_t ps_step_filled_from(const ps_step* step);
/* The step's push, every part sent: wait for it and free it as any push. FAILED_PRECONDITION
 * unless ps_step_gradient_final started it; once taken, the step has no push. */
PS_EXPORT int ps_step_take_push(ps_step* step, ps_op** push);
/* Waits for the step's pull, then frees the step; parts of a push not taken and not sent yet are
 * never sent (a backward pass that ended midway). */
PS_EXPORT void ps_step_free(ps_step* step);

/* easgd and local SGD (client/local_exchange.h): the worker trains a local model with an
 * optimizer of its own and trades it with the shards' centre every few steps, as the shards'
 * consistency model says; the schedule and the arithmetic are the library's.
 * ps_client_local_models: 1 when the shards' consistency model (known after register) has workers
 * train local models (easgd, local), else 0. */
PS_EXPORT int ps_client_local_models(const ps_client* client);
/* The exchange of the local model `values` (count = total_params floats, read and written in
 * place until ps_exchange_free) of a registered worker; FAILED_PRECONDITION when the shards run
 * no local models. Use it from one thread at a time, and free it before the client. */
PS_EXPORT int ps_client_exchange(ps_client* client, float* values, int64_t count,
                                 ps_exchange** out);
/* Starts the exchange due before step `step` is computed: the first one, whatever the step,
 * pulls the centre into `values`; later, local:H pulls it at a period's start (step % H == 0),
 * easgd:T pulls it, moves `values` by alpha (values - centre) towards it and pushes that
 * difference (sequence `step`) at step % T == 0. Most steps: nothing. */
PS_EXPORT int ps_exchange_before_step(ps_exchange* exchange, int64_t step);
/* Starts the exchange due after step `step`'s local update (`last` != 0: no step follows):
 * local:H pushes the change of `values` since its pull (sequence `step`) at a period's end
 * ((step + 1) % H == 0, or `last`). Most steps, and easgd: nothing. */
PS_EXPORT int ps_exchange_after_step(ps_exchange* exchange, int64_t step, int last);
/* Waits up to `timeout_seconds` (< 0: until it ends) for the exchange started last: 0 once it
 * succeeded (or none was due), PS_NOT_DONE while it goes on (a pull waiting for a local:H round
 * to close), else its error (the same on every later wait). Starting another before it ended:
 * FAILED_PRECONDITION. */
PS_EXPORT int ps_exchange_wait(ps_exchange* exchange, double timeout_seconds);
/* Waits for an exchange in progress, then frees it. */
PS_EXPORT void ps_exchange_free(ps_exchange* exchange);

/* Every shard's statistics as a JSON array (the StatsResponse message of proto/ps.proto, by
 * shard, every field present, 64-bit integers as JSON numbers too); free with ps_string_free. */
PS_EXPORT int ps_client_stats_json(ps_client* client, char** json);
PS_EXPORT void ps_string_free(char* s);

#ifdef __cplusplus
}
#endif

#endif /* PARAMSERVER_C_H_ */
