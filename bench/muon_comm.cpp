// Distributed Muon's communication (docs/architecture.md §7, the FSDP owner-per-bucket path): the
// bytes each rank sends per optimizer step in Muon's all_to_alls, against the alternative of
// all-gathering every Muon matrix to every rank and updating locally.
//
// A plain program (no Google Benchmark). For each rank count N (default 2 and 4) it starts N
// local worker processes (this binary again, with the torchrun variables; loopback Gloo), each
// of which builds the Trainer for the config below with parallel.dp_shard = N (FSDP; a
// bfloat16 model with fp32 main params and Muon + AdamW, as configs/qwen2_moe_tiny.yaml, on a
// model with ~70 Muon matrices), trains step 1 (creates the momentum), then for steps 2..S
// reads the communication counters (core/collectives.h) of its training thread around the
// optimizer step alone (Trainer::apply_update: AdamW does not communicate, so what is counted
// there is Muon's).
//
// Measured (per rank, per step, from the counters): the calls, bytes sent and seconds of
// Muon's all_to_all (both exchanges: the momentum shards to the owner, the update shards
// back), and anything else the optimizer step sent (Muon's 2-int parameter check all_reduce).
// Computed (from the parameter shapes of the same run): the alternative, in which every rank
// all-gathers the full momentum of every 2-D Muon matrix (ring all-gather: each rank sends its
// padded dim-0 chunk to N-1 peers = (N-1)/N of the padded matrix, in the same wire dtype) and
// runs Newton–Schulz on every matrix itself. The 3-D expert tensors are stepped locally (their
// dim-0 chunk is a set of whole matrices) in both designs and are not counted in either.
//
// Each matrix's N-1 foreign shards travel to its owner and its update's N-1 shards back: over
// the ranks, 2 (N-1)/N of every matrix, a mean of 2 (N-1)/N^2 per rank = 2/N of the
// all-gather's (N-1)/N: the same bytes at N = 2, half at N = 4; uneven chunks and which rank
// owns what (optim/muon_owner_plan.h) move a rank's figure around it. What the owner path saves
// for sure is compute: each rank runs ~1/N of the Newton–Schulz FLOPs (bench_muon_overlap).
//
// Usage: bench_muon_comm [--nproc N]... [--steps S] [--work-dir DIR] [--keep]
//   --nproc may be repeated (default 2 and 4); S >= 2 (default 3: step 1 unmeasured).
// Exit code 0 when every run was measured, 1 otherwise (a worker's log tail is printed).
#include <unistd.h>

#include <c10/util/accumulate.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"
#include "bench_workers.h"
#include "mixtrain/config/load.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/distributed/launcher.h"
#include "mixtrain/distributed/rendezvous.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/distributed_muon.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/optim/training_optimizer.h"
#include "mixtrain/trainer/trainer.h"

namespace {

using namespace mixtrain::bench;  // bench_support.h

constexpr const char* kWorkerEnv = "MIXTRAIN_MUON_COMM_WORKER";  // the config path
constexpr const char* kOutEnv = "MIXTRAIN_MUON_COMM_OUT";        // where ranks write results
constexpr const char* kStepsEnv = "MIXTRAIN_MUON_COMM_STEPS";

// configs/qwen2_moe_tiny.yaml's optimizer and precision sections (kMuonAdamWSections) on a wider,
// deeper model: 8 layers x (q, k, v, o, shared-expert gate/up/down, router, shared-expert gate)
// 2-D Muon matrices, 8 experts of 256 (3-D, stepped locally).
const std::string kConfig = std::string("# Written by bench_muon_comm (bench/muon_comm.cpp).\n") +
                            kMuonAdamWSections +
                            R"(model:
  name: qwen2_moe
  vocab_size: 4096
  hidden_size: 256
  num_layers: 8
  num_heads: 8
  num_kv_heads: 4
  head_dim: 32
  moe_intermediate_size: 256
  num_experts: 8
  num_experts_per_tok: 2
  shared_expert_intermediate_size: 512
  max_seq_len: 64
data:
  kind: synthetic
  seq_len: 64
  micro_batch_size: 2
  global_batch_size: 8
train:
  steps: 1000
  log_every: 1000
  lr_scheduler:
    warmup_steps: 1
checkpoint:
  interval: 0
)";

std::string env_or(const char* key, const std::string& fallback) {
  const char* value = std::getenv(key);
  return value != nullptr ? value : fallback;
}

// ---- worker: one rank ----

int worker_main(const std::string& config_path) {
  using namespace mixtrain;
  const RankInfo rank = detect_rank_info();
  set_log_rank(rank.rank);
  const std::string out = env_or(kOutEnv, ".");
  const int steps = std::atoi(env_or(kStepsEnv, "3").c_str());
  const ResolvedConfig resolved =
      load_config(config_path, {"parallel.dp_shard=" + std::to_string(rank.world_size)});
  const TrainerConfig& config = resolved.config;
  DeviceMesh mesh = join_mesh(config);
  const int n = mesh.world_size;
  Trainer trainer(resolved, mesh, out + "/run");
  trainer.step();  // step 1: creates the momentum buffers

  CollectiveStats optimizer_comm;  // summed over the measured steps
  for (int step = 2; step <= steps; ++step) {
    trainer.compute_gradients();
    const CollectiveStats before = thread_collective_stats();
    trainer.apply_update();
    const CollectiveStats span = thread_collective_stats() - before;
    for (size_t i = 0; i < kCollectiveOpCount; ++i) {
      optimizer_comm.ops[i].calls += span.ops[i].calls;
      optimizer_comm.ops[i].bytes += span.ops[i].bytes;
      optimizer_comm.ops[i].seconds += span.ops[i].seconds;
    }
  }
  const double measured = std::max(1, steps - 1);

  // The Muon matrices of this run, from the sharding the trainer gave them.
  ChainedOptimizer& chained = trainer.optimizer().chained();
  // The wire dtype distributed_muon.cpp picks for one group: bfloat16 when Newton–Schulz runs
  // in bfloat16, else muon_communication_dtype.
  const mixtrain::MuonOptions& muon = mixtrain::muon_config(config).options;
  const int64_t wire_bytes =
      muon.ns_dtype() == at::kBFloat16 || muon.communication_dtype() == at::kBFloat16 ? 2 : 4;
  int64_t matrices = 0, elements = 0, gather_bytes = 0, local_tensors = 0, local_elements = 0;
  for (const auto& placement : trainer.sharded()->placements()) {
    if (dynamic_cast<Muon*>(&chained.leaf_of(placement.name)) == nullptr) continue;  // AdamW
    const std::vector<int64_t>& shape = placement.global_shape;
    const int64_t numel = c10::multiply_integers(shape);
    if (muon_steps_locally(muon_sharding_of(placement), static_cast<int64_t>(shape.size()))) {
      ++local_tensors;
      local_elements += numel;
      continue;
    }
    ++matrices;
    elements += numel;
    // Ring all-gather of the padded dim-0 chunks: this rank's chunk reaches n-1 peers.
    const int64_t chunk_rows = (shape[0] + n - 1) / n;
    gather_bytes += (n - 1) * chunk_rows * (numel / shape[0]) * wire_bytes;
  }

  nlohmann::ordered_json result;
  result["rank"] = rank.rank;
  result["ranks"] = n;
  result["measured_steps"] = steps - 1;
  result["all_to_all_calls"] = optimizer_comm[CollectiveOp::kAllToAll].calls / measured;
  result["all_to_all_bytes"] = optimizer_comm[CollectiveOp::kAllToAll].bytes / measured;
  result["all_to_all_s"] = optimizer_comm[CollectiveOp::kAllToAll].seconds / measured;
  result["other_bytes"] =
      (optimizer_comm.total().bytes - optimizer_comm[CollectiveOp::kAllToAll].bytes) / measured;
  result["matrices"] = matrices;
  result["matrix_elements"] = elements;
  result["wire_bytes_per_element"] = wire_bytes;
  result["all_gather_bytes"] = gather_bytes;
  result["local_tensors"] = local_tensors;
  result["local_elements"] = local_elements;
  write_rank_result(out, rank.rank, result);
  return 0;
}

// ---- launcher: one run per rank count ----

RankSweepOptions parse_options(int argc, char** argv) {
  return parse_rank_sweep_options(
      argc, argv,
      "[--nproc N]... [--steps S] [--work-dir DIR] [--keep]\n"
      "Bytes each rank sends per step in distributed Muon's all_to_alls (FSDP owner path,\n"
      "measured) vs all-gathering every Muon matrix (computed from the shapes).\n",
      3, 2, "step 1 is not measured", {2, 4});
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", bytes / 1048576.0);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  mixtrain::register_model_sections();  // before any config is read
  mixtrain::register_optimizer_sections();
  program_name() = "bench_muon_comm";
  const std::string worker_config = env_or(kWorkerEnv, "");
  if (!worker_config.empty()) return worker_exit_code([&] { return worker_main(worker_config); });

  const RankSweepOptions options = parse_options(argc, argv);
  const std::string work_dir = make_work_dir(options.work_dir, "mixtrain-muon-comm");
  const std::string config_path = work_dir + "/muon_comm.yaml";
  std::ofstream(config_path) << kConfig;

  std::printf("machine: %ld CPUs online, %s; each rank 1 thread; loopback Gloo\n",
              sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str());
  std::printf("steps 2..%d measured, step 1 creates the momentum; work in %s\n\n", options.steps,
              work_dir.c_str());
  std::printf(
      "| ranks | Muon matrices (all_to_all path) | all_to_all per rank per step "
      "(measured: mean, max over ranks) | calls | all-gather alternative per rank per step "
      "(computed) | ratio all_to_all / all-gather | 2/N | all_to_all seconds per step "
      "(measured, mean) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::fflush(stdout);

  bool ok = true;
  std::vector<std::string> notes;
  for (int n : options.nprocs) {
    const std::string out = work_dir + "/n" + std::to_string(n);
    const std::vector<nlohmann::json> ranks = run_local_workers(
        n, "bench_muon_comm_worker",
        {{kWorkerEnv, config_path}, {kOutEnv, out}, {kStepsEnv, std::to_string(options.steps)}},
        out);
    if (ranks.empty()) {
      ok = false;
      continue;
    }
    double sum = 0, most = 0, calls = 0, seconds = 0, gather = 0, other = 0;
    for (const auto& r : ranks) {
      const double bytes = r["all_to_all_bytes"].get<double>();
      sum += bytes;
      most = std::max(most, bytes);
      calls += r["all_to_all_calls"].get<double>();
      seconds += r["all_to_all_s"].get<double>();
      gather += r["all_gather_bytes"].get<double>();
      other += r["other_bytes"].get<double>();
    }
    const double mean = sum / n, gather_mean = gather / n;
    std::printf("| %d | %lld (%.2fM elements) | %s, %s | %.0f | %s | %.3f | %.3f | %.3f |\n", n,
                static_cast<long long>(ranks[0]["matrices"].get<int64_t>()),
                ranks[0]["matrix_elements"].get<int64_t>() / 1e6, mib(mean).c_str(),
                mib(most).c_str(), calls / n, mib(gather_mean).c_str(), mean / gather_mean, 2.0 / n,
                seconds / n);
    std::fflush(stdout);
    // The owner plan gives each rank ~1/N of the Newton-Schulz FLOPs (muon_owner_plan.h).
    const int64_t matrices = ranks[0]["matrices"].get<int64_t>();
    char note[640];
    std::snprintf(note, sizeof(note),
                  "%d ranks: wire %lld bytes/element; besides all_to_all the optimizer step sent "
                  "%.0f bytes per rank (Muon's parameter-check all_reduce); Newton-Schulz runs "
                  "on the matrices each rank owns, ~1/%d of the %lld matrices' FLOPs "
                  "(all-gather alternative: all %lld on every rank); %lld 3-D expert tensors "
                  "(%.2fM elements) stepped locally, no communication in either design",
                  n, static_cast<long long>(ranks[0]["wire_bytes_per_element"].get<int64_t>()),
                  other / n, n, static_cast<long long>(matrices), static_cast<long long>(matrices),
                  static_cast<long long>(ranks[0]["local_tensors"].get<int64_t>()),
                  ranks[0]["local_elements"].get<int64_t>() / 1e6);
    notes.push_back(note);
  }
  std::printf("\n");
  for (const std::string& note : notes) std::printf("%s\n", note.c_str());

  keep_or_remove(work_dir, options.keep || !ok, "\nruns kept in ");
  return ok ? 0 : 1;
}
