// Distributed Muon's owner plan and its overlap (docs/architecture.md §7, optim/muon_owner_plan.h)
// on the Muon matrices of the ~41M-parameter config (kMedium41MConfig of bench_support.h:
// hidden 384, 6 layers; per layer q, o 384x384, k, v 128x384, shared-expert gate, up 768x384 and
// down 384x768, router 8x384, shared-expert gate 1x384: 54 2-D matrices, 7.67M elements; the
// 3-D experts step locally and are not here).
//
// 1. Balance, from the plans alone (no process is started): Newton–Schulz FLOPs owned per
//    rank (muon_owner_load) for the FLOP plan and for the round-robin plan it replaced (numel
//    ascending, ties by name, buckets of N, slot i -> rank i), at 2, 4 and 8 ranks: max/mean of
//    the per-rank totals and the sum over buckets of the busiest owner / mean.
// 2. Overlap, on N local worker processes (this binary again, loopback Gloo, one intra-op
//    thread each, the trainer's default CPU allocator: core/caching_cpu_allocator.h): each holds
//    its FSDP dim-0 shards (float32 main params, bfloat16 Newton–Schulz, 5 asym5 steps, the
//    config's), and times one Muon step four ways, median over R steps after one untimed step,
//    a world barrier before each:
//      overlapped  Muon::step over the Gloo group (async all_to_alls: the shipped path)
//      serial      the same through a group whose async calls are the blocking ones
//      compute     the same through a group that moves nothing (all_to_all returns zeros of
//                  the right shape): momentum, Newton–Schulz of the owned matrices, updates
//      comm        the all_to_all sequence the serial step made (counts, dtype), replayed
//                  with zero payloads back to back, nothing else
//    and of the overlapped step also: the seconds its all_to_alls block the calling thread
//    (the communication counters: start + wait host time), and the CPU seconds of the rank's
//    other threads (Gloo's workers and device loop: what moving the bytes costs in CPU, with
//    the kernel's TCP copies); of the serial step its time minus its blocked seconds (a
//    second estimate of the compute); of the compute alone its CPU seconds. It reports, per
//    rank count, the slowest rank's median of each, overlapped / max(compute, comm), and
//    overlapped / the CPU-shared bound: max(compute, comm, N x (compute CPU + the overlapped
//    step's other-thread CPU) / cores), the floor where every core runs a rank's compute and
//    the bytes are moved by the same cores (a NIC or NVLink DMA would not take them).
//
// Usage: bench_muon_overlap [--nproc N]... [--steps R] [--work-dir DIR] [--keep]
//   default N = 2, R = 5. Exit 0 when every run was measured.
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.h"
#include "bench_workers.h"
#include "mixtrain/core/caching_cpu_allocator.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/launcher.h"
#include "mixtrain/distributed/rendezvous.h"
#include "mixtrain/optim/distributed_muon.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/muon_owner_plan.h"

namespace {

using namespace mixtrain::bench;  // bench_support.h
namespace fs = std::filesystem;

constexpr const char* kWorkerEnv = "MIXTRAIN_MUON_OVERLAP_OUT";  // where a rank writes
constexpr const char* kStepsEnv = "MIXTRAIN_MUON_OVERLAP_STEPS";
constexpr int64_t kNsSteps = 5;

struct Matrix {
  std::string name;
  std::vector<int64_t> shape;
};

// The 2-D Muon matrices of kMedium41MConfig, named as the model names them.
std::vector<Matrix> medium_41m_matrices() {
  const int64_t hidden = 384, q = 6 * 64, kv = 2 * 64, shared = 768, experts = 8;
  std::vector<Matrix> matrices;
  for (int layer = 0; layer < 6; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    matrices.push_back({p + "self_attn.q_proj.weight", {q, hidden}});
    matrices.push_back({p + "self_attn.k_proj.weight", {kv, hidden}});
    matrices.push_back({p + "self_attn.v_proj.weight", {kv, hidden}});
    matrices.push_back({p + "self_attn.o_proj.weight", {hidden, q}});
    matrices.push_back({p + "mlp.gate.weight", {experts, hidden}});
    matrices.push_back({p + "mlp.shared_expert.gate_proj.weight", {shared, hidden}});
    matrices.push_back({p + "mlp.shared_expert.up_proj.weight", {shared, hidden}});
    matrices.push_back({p + "mlp.shared_expert.down_proj.weight", {hidden, shared}});
    matrices.push_back({p + "mlp.shared_expert_gate.weight", {1, hidden}});
  }
  return matrices;
}

std::vector<mixtrain::MuonOwnerItem> plan_items(const std::vector<Matrix>& matrices) {
  std::vector<mixtrain::MuonOwnerItem> items;
  for (const auto& m : matrices) {
    items.push_back({m.shape[0] * m.shape[1], m.name,
                     mixtrain::newton_schulz_flops(m.shape[0], m.shape[1], kNsSteps)});
  }
  return items;
}

// The plan before this one: numel ascending, ties by name, buckets of `ranks`, slot i -> rank i.
std::vector<mixtrain::MuonOwnerBucket> round_robin_plan(
    const std::vector<mixtrain::MuonOwnerItem>& items, int ranks) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].numel != items[b].numel) return items[a].numel < items[b].numel;
    return items[a].name < items[b].name;
  });
  std::vector<mixtrain::MuonOwnerBucket> plan;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i % static_cast<size_t>(ranks) == 0) plan.emplace_back();
    plan.back().items.push_back(order[i]);
    plan.back().owners.push_back(static_cast<int>(i % static_cast<size_t>(ranks)));
  }
  return plan;
}

// ---- the groups a worker steps through ----

// Forwards the blocking calls to `inner`; the async ones are Collectives' defaults (the
// blocking call at once), so Muon runs unoverlapped. Records every all_to_all's split and dtype.
class SerialGroup final : public mixtrain::Collectives {
 public:
  struct AllToAll {
    c10::ScalarType dtype;
    std::vector<int64_t> send, recv;
  };
  explicit SerialGroup(mixtrain::Collectives& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  void all_reduce(at::Tensor& t, mixtrain::ReduceOp op) override { inner_.all_reduce(t, op); }
  at::Tensor all_gather(const at::Tensor& t) override { return inner_.all_gather(t); }
  at::Tensor reduce_scatter_sum(const at::Tensor& t) override {
    return inner_.reduce_scatter_sum(t);
  }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send,
                        const std::vector<int64_t>& recv) override {
    if (recording) calls.push_back({input.scalar_type(), send, recv});
    return inner_.all_to_all(input, send, recv);
  }
  void broadcast(at::Tensor& t, int root) override { inner_.broadcast(t, root); }
  void barrier() override { inner_.barrier(); }

  bool recording = false;
  std::vector<AllToAll> calls;

 private:
  mixtrain::Collectives& inner_;
};

// Moves nothing: all_to_all returns normal random values of the received shape (Newton–Schulz
// of real-looking data), the parameter check's sum is size() times the local value (what
// agreeing ranks give). Muon's compute alone. Each buffer is made once per size and handed out
// again (Muon only reads what it receives): a fresh one would put its first touch (page
// faults, ~13 us per 4 KiB page on this VM) on the compute thread, where a real exchange has
// Gloo's threads write it.

class NoCommGroup final : public mixtrain::Collectives {
 public:
  NoCommGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "no_comm"; }
  void all_reduce(at::Tensor& t, mixtrain::ReduceOp op) override {
    if (op == mixtrain::ReduceOp::kSum) t.mul_(size_);  // the max of equal values is the value
  }
  at::Tensor all_gather(const at::Tensor& t) override { return at::cat(std::vector(size_, t)); }
  at::Tensor reduce_scatter_sum(const at::Tensor& t) override {
    return t.narrow(0, 0, t.size(0) / size_).mul(size_);
  }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>&,
                        const std::vector<int64_t>& recv) override {
    const int64_t rows = std::accumulate(recv.begin(), recv.end(), int64_t{0});
    at::Tensor& values = received_[{rows, input.scalar_type()}];
    if (!values.defined()) values = at::randn({rows}, at::kFloat).to(input.scalar_type());
    return values;
  }
  void broadcast(at::Tensor&, int) override {}
  void barrier() override {}

 private:
  int rank_, size_;
  std::map<std::pair<int64_t, c10::ScalarType>, at::Tensor> received_;
};

// ---- worker: one rank ----

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int worker_main(const std::string& out) {
  using namespace mixtrain;
  // The trainer's default (train.cpu_allocator: caching): a step reuses its buffers.
  install_caching_cpu_allocator();
  const RankInfo rank_info = detect_rank_info();
  const int steps = std::atoi(std::getenv(kStepsEnv));
  ParallelConfig parallel;
  parallel.dp_shard = rank_info.world_size;
  DeviceMesh mesh = make_device_mesh(rank_info, parallel, 600.0);
  Collectives& group = *mesh.dp_shard_group;
  const int n = group.size(), rank = group.rank();
  const auto matrices = medium_41m_matrices();

  // One Muon over this rank's shards, stepping through `comm`; the same data in every variant.
  struct Variant {
    std::vector<at::Tensor> params;
    std::unique_ptr<Muon> muon;
  };
  auto make = [&](const std::shared_ptr<Collectives>& comm) {
    Variant v;
    for (size_t i = 0; i < matrices.size(); ++i) {
      auto gen = at::detail::createCPUGenerator(100 + i);
      const at::Tensor full = at::randn(matrices[i].shape, gen, at::kFloat);
      const auto rows = fsdp_chunk_rows(full.size(0), n);
      int64_t start = 0;
      for (int r = 0; r < rank; ++r) start += rows[r];
      v.params.push_back(full.narrow(0, start, rows[rank]).clone());
      v.params.back().mutable_grad() = at::randn(v.params.back().sizes(), gen, at::kFloat);
    }
    v.muon = std::make_unique<Muon>(v.params, MuonOptions().lr(0.02).weight_decay(0.0));
    for (size_t i = 0; i < matrices.size(); ++i) {
      v.muon->set_sharding(v.params[i],
                           {MuonSharding::Kind::kFsdp, matrices[i].shape, comm, matrices[i].name});
    }
    return v;
  };
  std::shared_ptr<Collectives> gloo = mesh.dp_shard_group;
  auto serial_group = std::make_shared<SerialGroup>(group);
  auto no_comm = std::make_shared<NoCommGroup>(rank, n);
  Variant overlapped = make(gloo), serial = make(serial_group), compute = make(no_comm);

  // One timed span after a world barrier: wall seconds, this thread's CPU seconds and the
  // other threads' (Gloo's workers and device loop: the CPU that moving the bytes takes).
  struct Span {
    double wall, main_cpu, other_cpu;
  };
  auto timed = [&](const std::function<void()>& body) {
    mesh.world->barrier();
    const double process0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    const double thread0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    const auto start = Clock::now();
    body();
    const double wall = seconds_since(start);
    const double thread = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread0;
    return Span{wall, thread, cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process0 - thread};
  };
  std::map<std::string, std::vector<double>> figures;  // per step, keyed as in the JSON
  std::vector<at::Tensor> payloads;                    // the replay's inputs
  for (int step = 0; step <= steps; ++step) {          // step 0: untimed (creates the momentum)
    serial_group->recording = step == 0;
    const CollectiveStats before_a = thread_collective_stats();
    const Span a = timed([&] { overlapped.muon->step(); });
    const double a_waits = (thread_collective_stats() - before_a)[CollectiveOp::kAllToAll].seconds;
    const CollectiveStats before = thread_collective_stats();
    const Span b = timed([&] { serial.muon->step(); });
    const double b_waits = (thread_collective_stats() - before)[CollectiveOp::kAllToAll].seconds;
    const Span c = timed([&] { compute.muon->step(); });
    if (step == 0) {
      for (const auto& call : serial_group->calls) {
        const int64_t rows = std::accumulate(call.send.begin(), call.send.end(), int64_t{0});
        payloads.push_back(at::zeros({rows}, call.dtype));  // made outside the timed span
      }
    }
    const Span d = timed([&] {
      for (size_t i = 0; i < payloads.size(); ++i) {
        const auto& call = serial_group->calls[i];
        group.all_to_all(payloads[i], call.send, call.recv);
      }
    });
    if (step == 0) continue;
    const std::pair<const char*, double> row[] = {
        {"overlapped_s", a.wall},
        {"overlapped_waits_s", a_waits},
        {"overlapped_main_cpu_s", a.main_cpu},
        {"overlapped_other_cpu_s", a.other_cpu},
        {"serial_s", b.wall},
        {"serial_compute_s", b.wall - b_waits},
        {"compute_s", c.wall},
        {"compute_cpu_s", c.main_cpu + c.other_cpu},
        {"comm_s", d.wall},

    };
    for (const auto& [key, value] : row) figures[key].push_back(value);
  }
  nlohmann::ordered_json result;
  result["rank"] = rank;
  result["all_to_alls"] = serial_group->calls.size();
  for (const auto& [key, values] : figures) result[key] = median(values);
  write_rank_result(out, rank, result);
  return 0;
}

// ---- launcher ----

RankSweepOptions parse_options(int argc, char** argv) {
  return parse_rank_sweep_options(
      argc, argv,
      "[--nproc N]... [--steps R] [--work-dir DIR] [--keep]\n"
      "Distributed Muon's owner balance (FLOP plan vs round-robin) on the 41M config's\n"
      "matrices, and its step overlapped vs serial vs compute alone vs comm alone.\n",
      5, 1, nullptr, {2});
}

void print_balance() {
  const auto matrices = medium_41m_matrices();
  const auto items = plan_items(matrices);
  int64_t elements = 0;
  for (const auto& item : items) elements += item.numel;
  std::printf(
      "Owner balance, %zu Muon matrices of the 41M config (%.2fM elements), Newton-Schulz "
      "FLOPs with %lld steps (4 m^2 n + 2 m^3 per step)\n\n",
      items.size(), elements / 1e6, static_cast<long long>(kNsSteps));
  std::printf(
      "| ranks | plan | buckets | max/mean owner FLOPs | sum of bucket max / mean | "
      "per-rank GFLOP |\n| --- | --- | --- | --- | --- | --- |\n");
  for (int ranks : {2, 4, 8}) {
    for (bool flop_plan : {false, true}) {
      const auto plan =
          flop_plan ? mixtrain::muon_owner_plan(items, ranks) : round_robin_plan(items, ranks);
      const auto load = mixtrain::muon_owner_load(items, plan, ranks);
      std::string per_rank;
      for (int64_t f : load.per_rank) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%s%.2f", per_rank.empty() ? "" : " ", f / 1e9);
        per_rank += buf;
      }
      std::printf("| %d | %s | %zu | %.3f | %.3f | %s |\n", ranks,
                  flop_plan ? "FLOP (LPT)" : "round-robin", plan.size(), load.max_over_mean,
                  load.bucket_max_sum_over_mean, per_rank.c_str());
    }
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  program_name() = "bench_muon_overlap";
  if (const char* out = std::getenv(kWorkerEnv)) {
    return worker_exit_code([&] { return worker_main(out); });
  }
  const RankSweepOptions options = parse_options(argc, argv);
  print_balance();
  const std::string work_dir = make_work_dir(options.work_dir, "mixtrain-muon-overlap");
  std::printf(
      "Overlap: machine %ld CPUs online, %s; each rank 1 thread; loopback Gloo; median "
      "of %d steps after 1 untimed; slowest rank's median\n\n",
      sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str(), options.steps);
  std::printf(
      "| ranks | all_to_alls | overlapped (ms) | its all_to_all waits (ms) | its other threads' "
      "CPU (ms) | serial (ms) | serial minus its waits (ms) | compute alone (ms) | comm alone "
      "(ms) | compute alone CPU (ms) | overlapped / max(compute, comm) | serial / max | "
      "CPU-shared bound (ms) | overlapped / CPU-shared bound |\n");
  std::string separator = "|";
  for (int column = 0; column < 14; ++column) separator += " --- |";
  std::printf("%s\n", separator.c_str());
  bool ok = true;
  for (int n : options.nprocs) {
    const std::string out = work_dir + "/n" + std::to_string(n);
    const std::vector<nlohmann::json> ranks =
        run_local_workers(n, "bench_muon_overlap_worker",
                          {{kWorkerEnv, out}, {kStepsEnv, std::to_string(options.steps)}}, out);
    if (ranks.empty()) {
      ok = false;
      continue;
    }
    // The slowest rank's median of each figure.
    std::map<std::string, double> worst;
    int64_t calls = 0;
    for (const nlohmann::json& r : ranks) {
      for (const auto& [key, value] : r.items()) {
        if (key != "rank" && key != "all_to_alls")
          worst[key] = std::max(worst[key], value.get<double>());
      }
      calls = r["all_to_alls"].get<int64_t>();
    }
    const double bound = std::max(worst["compute_s"], worst["comm_s"]);
    // With a compute thread per rank on every core, the CPU that moves the bytes (the overlapped
    // step's other threads) is taken from the compute: n ranks' compute CPU plus that, over
    // the cores, bounds the step from below too.
    const double cpu_bound =
        std::max(bound, n * (worst["compute_cpu_s"] + worst["overlapped_other_cpu_s"]) /
                            static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)));
    std::printf(
        "| %d | %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | "
        "%.1f | %.2f |\n",
        n, static_cast<long long>(calls), worst["overlapped_s"] * 1e3,
        worst["overlapped_waits_s"] * 1e3, worst["overlapped_other_cpu_s"] * 1e3,
        worst["serial_s"] * 1e3, worst["serial_compute_s"] * 1e3, worst["compute_s"] * 1e3,
        worst["comm_s"] * 1e3, worst["compute_cpu_s"] * 1e3, worst["overlapped_s"] / bound,
        worst["serial_s"] / bound, cpu_bound * 1e3, worst["overlapped_s"] / cpu_bound);
    std::fflush(stdout);
  }
  keep_or_remove(work_dir, options.keep || !ok, "\nruns kept in ");
  return ok ? 0 : 1;
}
