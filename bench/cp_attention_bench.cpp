// Context-parallel attention (distributed/context_parallel.h): ring ("alltoall") against
// all-gather, on N local ranks (loopback Gloo, 1 thread each), for a few sequence lengths, with
// the single-process causal_attention (model/attention.h) on the whole sequence as the baseline.
//
// A plain program. For each rank count N (default 2 and 4) it starts N worker processes (this
// binary again, with the torchrun variables) on a dp_shard 1 x cp N mesh. Per sequence length S
// (default 512, 1024, 2048) and method each rank times forward + backward (autograd::grad of
// q, k, v) of its S/N queries, float32, kFlash precision (the model's float32 kernel), shape
// B 1, Hq 8, Hkv 2, D 64; median of --reps timed calls after one untimed, a barrier before
// each. Rank 0 also times causal_attention(kFlash) of the whole sequence in one process.
//
// Bytes: the communication counters (core/collectives.h) of one call, per rank, against the
// analytic volume with block = B Hkv (S/N) D 4 bytes (one rank's K or V):
//   ring:      N - 1 shifts of K and V forward, N - 1 of their gradients back: 4 (N-1) block
//   allgather: all_gather of K and V, (N-1) 2 block; reduce_scatter of their float32
//              gradients, (N-1)/N of 2 N block: 4 (N-1) block as well (in bfloat16 both
//              send K/V in bfloat16 and gradients in float32, except the kMath ring, whose
//              gradients travel in bfloat16)
//
// Usage: bench_cp_attention_bench [--nproc N]... [--seq S]... [--reps R]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"
#include "bench_workers.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/distributed/context_parallel.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/launcher.h"
#include "mixtrain/distributed/rendezvous.h"
#include "mixtrain/model/attention.h"

namespace {

using namespace mixtrain::bench;  // bench_support.h

constexpr const char* kWorkerEnv = "MIXTRAIN_CP_BENCH_OUT";  // set in workers: the result file
constexpr const char* kSeqEnv = "MIXTRAIN_CP_BENCH_SEQ";     // comma-separated lengths
constexpr const char* kRepsEnv = "MIXTRAIN_CP_BENCH_REPS";
constexpr int64_t kBatch = 1, kHeads = 8, kKvHeads = 2, kHeadDim = 64;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t comma = text.find(',', pos);
    out.push_back(std::atoll(text.substr(pos, comma - pos).c_str()));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

int worker_main(const std::string& out_path) {
  using namespace mixtrain;
  at::set_num_threads(1);
  const RankInfo rank = detect_rank_info();
  ParallelConfig parallel;
  parallel.dp_shard = 1;
  parallel.cp = rank.world_size;
  const DeviceMesh mesh = make_device_mesh(rank, parallel, 300);
  const int64_t n = mesh.cp, r = mesh.cp_index();
  const int reps = std::atoi(std::getenv(kRepsEnv));
  std::ofstream out(out_path);
  for (const int64_t seq : parse_list(std::getenv(kSeqEnv))) {
    at::manual_seed(0);
    std::vector<at::Tensor> whole;
    for (int64_t heads : {kHeads, kKvHeads, kKvHeads, kHeads}) {
      whole.push_back(at::randn({kBatch, heads, seq, kHeadDim}));
    }
    std::vector<at::Tensor> local;
    for (const auto& t : whole) local.push_back(context_parallel_slice(t, r, n, 2));
    for (int i = 0; i < 3; ++i) local[i].requires_grad_();
    nlohmann::ordered_json row;
    row["seq"] = seq;
    for (const auto method : {CpRotateMethod::kAllToAll, CpRotateMethod::kAllGather}) {
      ContextParallel cp(mesh.cp_group, method);
      std::vector<double> times;
      CollectiveStats one_call;
      for (int rep = 0; rep <= reps; ++rep) {
        mesh.cp_group->barrier();
        const CollectiveStats before = thread_collective_stats();
        const auto start = std::chrono::steady_clock::now();
        const at::Tensor o = cp.attention(local[0], local[1], local[2], AttentionKernel::kFlash);
        torch::autograd::grad({o}, {local[0], local[1], local[2]}, {local[3]});
        if (rep > 0) times.push_back(seconds_since(start));
        one_call = thread_collective_stats() - before;
      }
      const std::string name = method == CpRotateMethod::kAllToAll ? "ring" : "allgather";
      row[name + "_s"] = median(times);
      row[name + "_bytes"] = one_call.total().bytes;
      row[name + "_comm_s"] = one_call.total().seconds;
    }
    if (r == 0) {
      for (int i = 0; i < 3; ++i) whole[i].requires_grad_();
      std::vector<double> times;
      for (int rep = 0; rep <= reps; ++rep) {
        const auto start = std::chrono::steady_clock::now();
        const at::Tensor o =
            causal_attention(whole[0], whole[1], whole[2], AttentionKernel::kFlash);
        torch::autograd::grad({o}, {whole[0], whole[1], whole[2]}, {whole[3]});
        if (rep > 0) times.push_back(seconds_since(start));
      }
      row["single_s"] = median(times);
    }
    row["analytic_bytes"] = 4 * (n - 1) * kBatch * kKvHeads * (seq / n) * kHeadDim * 4;
    out << row.dump() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  program_name() = "bench_cp_attention_bench";
  if (const char* out = std::getenv(kWorkerEnv)) {
    try {
      return worker_main(out);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "ERROR: %s\n", error.what());
      return 1;
    }
  }
  std::vector<int> nprocs;
  std::string seqs;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--nproc") {
      nprocs.push_back(std::atoi(option_value(argc, argv, i).c_str()));
    } else if (arg == "--seq") {
      seqs += (seqs.empty() ? "" : ",") + option_value(argc, argv, i);
    } else if (arg == "--reps") {
      reps = std::atoi(option_value(argc, argv, i).c_str());
    } else {
      fail("unknown argument " + arg + " (usage: [--nproc N]... [--seq S]... [--reps R])");
    }
  }
  if (nprocs.empty()) nprocs = {2, 4};
  if (seqs.empty()) seqs = "512,1024,2048";
  const std::string dir = make_work_dir("", "mixtrain-cp-bench");
  std::printf("machine: %ld CPUs online, %s; each rank 1 thread; loopback Gloo\n",
              sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str());
  std::printf("float32, B %lld, Hq %lld, Hkv %lld, D %lld; fwd+bwd median of %d\n\n",
              static_cast<long long>(kBatch), static_cast<long long>(kHeads),
              static_cast<long long>(kKvHeads), static_cast<long long>(kHeadDim), reps);
  std::printf(
      "| ranks | seq | one process (ms) | ring (ms) | allgather (ms) | ring bytes/rank | "
      "allgather bytes/rank | analytic | ring comm (ms) | allgather comm (ms) |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  bool ok = true;
  for (const int n : nprocs) {
    const std::string prefix = dir + "/n" + std::to_string(n) + "_rank";
    std::vector<mixtrain::WorkerSpec> specs =
        local_workers(n, "bench_cp_attention_worker",
                      {{kSeqEnv, seqs}, {kRepsEnv, std::to_string(reps)}}, prefix);
    for (int rank = 0; rank < n; ++rank)
      specs[rank].env[kWorkerEnv] = prefix + std::to_string(rank);
    mixtrain::LaunchOptions launch;
    launch.deadline_s = 1800;
    const auto outcomes = mixtrain::run_worker_processes(specs, launch);
    for (int rank = 0; rank < n; ++rank) {
      if (!outcomes[rank].ok()) {
        std::fprintf(stderr, "%d ranks: rank %d %s:\n%s", n, rank,
                     outcomes[rank].describe().c_str(),
                     tail_of_file(specs[rank].output_path, 8).c_str());
        ok = false;
      }
    }
    if (!ok) continue;
    // Rank 0's rows (its timings; the bytes are the same on every rank by construction).
    for (const auto& row : read_jsonl(specs[0].env[kWorkerEnv])) {
      std::printf(
          "| %d | %lld | %.1f | %.1f | %.1f | %lld | %lld | %lld | %.1f | %.1f |\n", n,
          static_cast<long long>(row["seq"].get<int64_t>()), 1e3 * row["single_s"].get<double>(),
          1e3 * row["ring_s"].get<double>(), 1e3 * row["allgather_s"].get<double>(),
          static_cast<long long>(row["ring_bytes"].get<int64_t>()),
          static_cast<long long>(row["allgather_bytes"].get<int64_t>()),
          static_cast<long long>(row["analytic_bytes"].get<int64_t>()),
          1e3 * row["ring_comm_s"].get<double>(), 1e3 * row["allgather_comm_s"].get<double>());
    }
    std::fflush(stdout);
  }
  keep_or_remove(dir, false, "");
  return ok ? 0 : 1;
}
