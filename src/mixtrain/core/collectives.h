// The narrow collective-communication interface the optimizer and the parallel layouts use
// (docs/architecture.md §2, §7). optim/ and model/ talk only to this; distributed/ implements it on
// c10d's Gloo and, for a CUDA run's compute groups, NCCL (nccl_collectives.h: stream-ordered
// waits); LocalCollectives is the one-rank identity, so every layout runs the same code.
//
// Every call is collective over the group: all ranks call it in the same order with tensors of
// the same dtype and shape (except where a split says otherwise). Tensors are contiguous, on the
// group's device (Gloo: CPU). Payload dtypes: float32, float64, bfloat16, float16, int32, int64,
// uint8. Reductions of bfloat16 are not offered (a bfloat16 sum rounds every partial sum): reduce
// in float32. A failed or timed-out peer raises mixtrain::UserError naming the op and the group.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mixtrain {

// A collective started by one of the *_async calls below and possibly still in flight. wait()
// blocks until this rank's part is done (on NCCL: makes the calling thread's current stream
// wait, as the blocking calls do) and returns the result the blocking call would have
// returned; it raises what the blocking call would raise. Call it once, before the group it
// came from is destroyed. Destroying an unwaited handle waits and drops any error (an
// exception already unwinding is the one to report), so the buffers are never freed while the
// collective still reads or writes them.
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  virtual at::Tensor wait() = 0;
};

class CollectiveCounters;  // below

// The elementwise reduction of all_reduce. Max rounds nothing, so for NaN-free inputs every
// rank gets the same bits whatever order the backend combines them in.
enum class ReduceOp { kSum, kMax };

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;          // rank within this group
  virtual int size() const = 0;          // ranks in this group
  virtual std::string name() const = 0;  // e.g. "dp_shard", for error messages

  // In-place elementwise `op` over the group (float32/float64/int64).
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  void all_reduce_sum(at::Tensor& tensor) { all_reduce(tensor, ReduceOp::kSum); }
  // Concatenation along dim 0 of every rank's `local` (equal shapes), in rank order.
  virtual at::Tensor all_gather(const at::Tensor& local) = 0;
  // `full` has size() equal chunks along dim 0; returns the sum over ranks of chunk rank()
  // (float32/float64). Same bytes on the wire as a ring reduce-scatter.
  virtual at::Tensor reduce_scatter_sum(const at::Tensor& full) = 0;
  // Rows [offset_i, offset_i + send_counts[i]) of `input` (dim 0) go to rank i; returns the
  // rows received, rank order, shaped [sum(recv_counts), input.shape[1:]...].
  virtual at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& recv_counts) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;

  // all_to_all / all_gather started and left in flight, so the caller can compute meanwhile
  // (distributed Muon overlaps its exchanges with Newton–Schulz this way). Every rank starts
  // them in the same order, as for the blocking calls, but may wait in any order; `input` /
  // `local` must not be modified until wait() returns. The defaults run the blocking call at
  // once and return it finished (the one-rank group, in-process test groups); Gloo and NCCL
  // start them asynchronously on c10d's work queue / stream. Counted as one call each (bytes at
  // the start; seconds: host time in the start and in wait(), not the time in flight).
  virtual std::unique_ptr<CollectiveWork> all_to_all_async(const at::Tensor& input,
                                                           const std::vector<int64_t>& send_counts,
                                                           const std::vector<int64_t>& recv_counts);
  virtual std::unique_ptr<CollectiveWork> all_gather_async(const at::Tensor& local);

  // Counters this group's calls are also added to, whichever thread makes them (below); none
  // by default. Set before the first call: make_device_mesh gives one rank's training groups
  // one set (DeviceMesh::counters).
  void count_into(std::shared_ptr<CollectiveCounters> counters) { counters_ = std::move(counters); }
  const std::shared_ptr<CollectiveCounters>& counters() const { return counters_; }

 private:
  std::shared_ptr<CollectiveCounters> counters_;
};

// A CollectiveWork that is already done: wait() returns `result`.
std::unique_ptr<CollectiveWork> finished_collective_work(at::Tensor result);

// Every rank's `text`, in rank order (variable lengths: the lengths travel first). Collective.
std::vector<std::string> all_gather_strings(Collectives& group, const std::string& text);

// The one-rank group: every collective is the identity (all_gather/reduce_scatter/all_to_all
// return a copy of their input). Its calls are counted (below) with 0 bytes.
std::unique_ptr<Collectives> make_local_collectives(const std::string& name = "local");

// ---- Communication counters ----
//
// Every Collectives call made in this process is counted, per operation kind: the calls, the
// payload bytes this rank sends, and the wall seconds spent inside the call (waiting for the
// peers included). The counters are per process (every group, every thread, summed), per
// thread, and per set of groups (CollectiveCounters: one rank's training traffic, whichever
// thread issued it; on CUDA, autograd runs backward, and with it FSDP's reduce-scatter and EP's
// backward all_to_all, on a device worker thread that the calling thread's counters miss). They
// only grow until reset.
//
// Bytes: what this rank's own data must put on the wire to reach the peers that need it, as a
// bandwidth-optimal algorithm sends it (a ring for the reductions and the gather, direct
// sends for all_to_all). n = group size, B = nbytes of the tensor passed in:
//   all_reduce      2 (n-1)/n B   ring all-reduce = reduce-scatter + all-gather (rounded down);
//                                 sum and max alike, under the one key (same traffic)
//   all_gather      (n-1) B       the local block reaches n-1 peers: (n-1)/n of the result
//   reduce_scatter  (n-1)/n B     B is the full input; the n-1 chunks that belong to the peers
//   all_to_all      sum over peers i != rank of send_counts[i] rows x the bytes of one row
//                   (the block a rank keeps for itself never leaves it)
//   broadcast       (n-1) B on the root, 0 on the others (the root's data reaches n-1 peers; a
//                   tree or chain spreads these bytes over forwarding ranks, but the group
//                   total is the same)
//   barrier         0
// These are the bytes of the ideal algorithm, not a packet capture: Gloo's own algorithms
// (e.g. its reduce_scatter emulated by alltoall_base, which sends exactly (n-1)/n B) may send
// more or less, and headers are not counted. A one-rank group sends 0 bytes. bfloat16 and
// float16 count 2 bytes per element. A call that fails (a dead peer)
// is still counted, with the time until it failed; argument errors, thrown before any
// communication, are not.
enum class CollectiveOp { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kBarrier };
inline constexpr size_t kCollectiveOpCount = 6;
// "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier".
const char* collective_op_name(CollectiveOp op);

struct CollectiveOpStats {
  int64_t calls = 0;
  int64_t bytes = 0;     // sent by this rank, per the table above
  double seconds = 0.0;  // wall time inside the calls
};

struct CollectiveStats {
  std::array<CollectiveOpStats, kCollectiveOpCount> ops{};  // indexed by CollectiveOp

  CollectiveOpStats& operator[](CollectiveOp op) { return ops[static_cast<size_t>(op)]; }
  const CollectiveOpStats& operator[](CollectiveOp op) const {
    return ops[static_cast<size_t>(op)];
  }
  CollectiveOpStats total() const;  // every op kind summed
  // What happened between two snapshots: later - earlier, field by field.
  CollectiveStats operator-(const CollectiveStats& earlier) const;
};

// This process (every thread and group). Thread-safe.
CollectiveStats collective_stats();
// The calling thread only: e.g. the training loop's traffic without an async checkpoint
// thread's.
CollectiveStats thread_collective_stats();
// Zeroes the process counters and the calling thread's (other threads' own counters keep
// their values; take differences of snapshots to measure a span instead).
void reset_collective_stats();

// Counters shared by a set of groups (Collectives::count_into), added to by any thread.
// Thread-safe.
class CollectiveCounters {
 public:
  CollectiveStats snapshot() const;
  void add(CollectiveOp op, int64_t bytes, double seconds);

 private:
  mutable std::mutex mutex_;
  CollectiveStats stats_;
};

// For implementations of Collectives: adds one call to the process's and the calling thread's
// counters, and to `group`'s (may be null). Thread-safe.
void record_collective(CollectiveOp op, int64_t bytes, double seconds,
                       CollectiveCounters* group = nullptr);

// Times a scope and records it as one call of `op` by `group` when the scope ends (also by an
// exception).
class CollectiveCallRecord {
 public:
  CollectiveCallRecord(const Collectives& group, CollectiveOp op, int64_t bytes)
      : counters_(group.counters().get()),
        op_(op),
        bytes_(bytes),
        start_(std::chrono::steady_clock::now()) {}
  ~CollectiveCallRecord() {
    record_collective(
        op_, bytes_,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(),
        counters_);
  }
  CollectiveCallRecord(const CollectiveCallRecord&) = delete;
  CollectiveCallRecord& operator=(const CollectiveCallRecord&) = delete;

 private:
  CollectiveCounters* counters_;
  CollectiveOp op_;
  int64_t bytes_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mixtrain
