// NcclCollectives on one GPU (label cuda; skipped without a CUDA device). Multi-rank NCCL needs
// a GPU per rank; here a world-size-1 NCCL group (rank 0 of 1 on cuda:0, a FileStore in a temp
// dir) is checked against each op's definition at n = 1: all_gather, reduce_scatter_sum,
// all_to_all, all_reduce (sum and max) and broadcast are the identity, bitwise (one rank's sum is
// its own value; float16 goes to float32 and back, which is exact), for every payload dtype the op
// offers; the refusals; host tensors staged through the device; stream order on a side stream;
// the counters (a call each, 0 bytes at n = 1); the async all_to_all / all_gather, several in
// flight, waited in reverse order. And the failure paths, fast: rank 1 of a 2-rank group whose
// rank 0 never comes fails within the store timeout with the op's UserError; rank 0 whose rank 1
// never comes gives up after the group's timeout (the non-blocking communicator).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "mixtrain/core/error.h"
#include "mixtrain/distributed/collective_checks.h"
#include "mixtrain/distributed/nccl_collectives.h"
#include "support/scoped_temp_dir.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

const c10::Device kDevice(c10::kCUDA, 0);

// A fresh temporary directory (for the FileStore), removed at scope exit.
class TempDir : public test_support::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("mixtrain-nccl-") {}
};

c10::intrusive_ptr<c10d::Store> file_store(const std::string& path, int ranks,
                                           std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::FileStore>(path, ranks);
  store->setTimeout(timeout);
  return store;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor x = a.cpu().contiguous();
  const at::Tensor y = b.cpu().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Distinct finite values per element, exact in every dtype below (integers 0..119 in a
// bfloat16 / float16 / uint8 / int8 too).
at::Tensor sample(at::ScalarType type, at::IntArrayRef shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return (at::arange(numel, at::kDouble) % 120).reshape(shape).to(kDevice, type);
}

class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    c10::cuda::set_device(0);
    group_ =
        std::make_shared<NcclGroup>(file_store(dir_.file("store"), 1, std::chrono::seconds(30)), 0,
                                    1, kDevice, std::chrono::seconds(30));
    group_->connect();
    comm_ = std::make_unique<NcclCollectives>(group_, "t", 0);
  }
  TempDir dir_;
  std::shared_ptr<NcclGroup> group_;
  std::unique_ptr<NcclCollectives> comm_;
};

TEST_F(NcclOneRank, ReportsItsPlaceAndName) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_EQ(comm_->name(), "t");
}

TEST_F(NcclOneRank, AllGatherIsTheIdentityForEveryDtype) {
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong,
                              at::kInt, at::kByte, at::kChar}) {
    SCOPED_TRACE(c10::toString(type));
    const at::Tensor local = sample(type, {3, 4});
    const at::Tensor gathered = comm_->all_gather(local);
    EXPECT_EQ(gathered.device(), kDevice);
    EXPECT_TRUE(same_bits(gathered, local));
  }
  // A scalar gathers into a vector of one.
  const at::Tensor scalar = at::scalar_tensor(7.0, at::TensorOptions().device(kDevice));
  EXPECT_TRUE(same_bits(comm_->all_gather(scalar), scalar.reshape({1})));
  // bfloat16 bytes a float round trip would change (NaN payload, -0, subnormal) travel as is.
  at::Tensor bits =
      at::tensor(std::vector<int16_t>{0x7F81, static_cast<int16_t>(0x8000), 0x0001}, at::kShort)
          .view(at::kBFloat16)
          .to(kDevice);
  EXPECT_TRUE(same_bits(comm_->all_gather(bits), bits));
}

TEST_F(NcclOneRank, ReductionsOfOneRankAreItsOwnValues) {
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kLong, at::kInt}) {
    SCOPED_TRACE(c10::toString(type));
    const at::Tensor original = sample(type, {4, 3});
    at::Tensor reduced = original.clone();
    comm_->all_reduce_sum(reduced);
    EXPECT_EQ(reduced.device(), kDevice);
    EXPECT_TRUE(same_bits(reduced, original));
    at::Tensor maxed = original.clone();  // ncclMax of one rank: its own value
    comm_->all_reduce(maxed, ReduceOp::kMax);
    EXPECT_EQ(maxed.device(), kDevice);
    EXPECT_TRUE(same_bits(maxed, original));
    const at::Tensor scattered = comm_->reduce_scatter_sum(original);
    EXPECT_EQ(scattered.device(), kDevice);
    EXPECT_TRUE(same_bits(scattered, original));  // dtype kept (float16 is not left widened)
  }
  // Non-integer float16 values too: float16 -> float32 -> float16 is exact.
  const at::Tensor halves = at::randn({64}, at::kFloat).to(kDevice, at::kHalf);
  at::Tensor reduced = halves.clone();
  comm_->all_reduce_sum(reduced);
  EXPECT_TRUE(same_bits(reduced, halves));
  EXPECT_TRUE(same_bits(comm_->reduce_scatter_sum(halves), halves));
}

TEST_F(NcclOneRank, AllToAllSendsEveryRowToItself) {
  for (at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong, at::kByte}) {
    SCOPED_TRACE(c10::toString(type));
    const at::Tensor input = sample(type, {5, 2, 3});
    const at::Tensor output = comm_->all_to_all(input, {5}, {5});
    EXPECT_EQ(output.device(), kDevice);
    EXPECT_TRUE(same_bits(output, input));
  }
  const at::Tensor empty = sample(at::kFloat, {0, 4});
  EXPECT_EQ(comm_->all_to_all(empty, {0}, {0}).sizes(), empty.sizes());
}

TEST_F(NcclOneRank, AsyncCallsGiveTheBlockingResultsInAnyWaitOrder) {
  // Two all_to_alls and an all_gather in flight at once (one device, one host input), waited in
  // reverse order; each equals its input (one rank) on the input's device; a second wait throws.
  const at::Tensor on_device = sample(at::kBFloat16, {5, 3});
  const at::Tensor on_host = at::arange(6, at::kFloat).reshape({3, 2});
  auto first = comm_->all_to_all_async(on_device, {5}, {5});
  auto second = comm_->all_to_all_async(on_host, {3}, {3});
  auto third = comm_->all_gather_async(on_device);
  const at::Tensor gathered = third->wait();
  const at::Tensor host_rows = second->wait();
  const at::Tensor device_rows = first->wait();
  EXPECT_TRUE(same_bits(gathered, on_device));
  EXPECT_TRUE(host_rows.device().is_cpu());
  EXPECT_TRUE(same_bits(host_rows, on_host));
  EXPECT_EQ(device_rows.device(), kDevice);
  EXPECT_TRUE(same_bits(device_rows, on_device));
  EXPECT_THROW(first->wait(), std::logic_error);
}

TEST_F(NcclOneRank, BroadcastFromRankZeroKeepsTheTensorAndBarrierReturns) {
  const at::Tensor original = sample(at::kBFloat16, {6});
  at::Tensor tensor = original.clone();
  comm_->broadcast(tensor, 0);
  EXPECT_TRUE(same_bits(tensor, original));
  comm_->barrier();
}

TEST_F(NcclOneRank, HostTensorsAreStagedThroughTheDeviceAndComeBack) {
  at::Tensor flag = at::tensor(std::vector<int64_t>{3, 5});
  comm_->all_reduce_sum(flag);
  EXPECT_TRUE(flag.device().is_cpu());
  EXPECT_EQ(flag[0].item<int64_t>(), 3);
  EXPECT_EQ(flag[1].item<int64_t>(), 5);
  const at::Tensor text = at::arange(10, at::kByte);
  const at::Tensor gathered = comm_->all_gather(text);
  EXPECT_TRUE(gathered.device().is_cpu());
  EXPECT_TRUE(same_bits(gathered, text));
  const at::Tensor rows = at::arange(6, at::kFloat).reshape({3, 2});
  const at::Tensor exchanged = comm_->all_to_all(rows, {3}, {3});
  EXPECT_TRUE(exchanged.device().is_cpu());
  EXPECT_TRUE(same_bits(exchanged, rows));
  const at::Tensor scattered = comm_->reduce_scatter_sum(rows);
  EXPECT_TRUE(scattered.device().is_cpu());
  EXPECT_TRUE(same_bits(scattered, rows));
}

TEST_F(NcclOneRank, RefusalsNameTheGroupAndAreNotCounted) {
  const CollectiveStats before = thread_collective_stats();
  at::Tensor bf16 = sample(at::kBFloat16, {4});
  EXPECT_THROW(comm_->all_reduce_sum(bf16), std::invalid_argument);
  EXPECT_THROW(comm_->reduce_scatter_sum(bf16), std::invalid_argument);
  EXPECT_THROW(comm_->reduce_scatter_sum(sample(at::kByte, {4})), std::invalid_argument);
  EXPECT_THROW(
      comm_->reduce_scatter_sum(at::scalar_tensor(1.0, at::TensorOptions().device(kDevice))),
      std::invalid_argument);
  EXPECT_THROW(comm_->all_to_all(sample(at::kFloat, {4, 2}), {3}, {4}), std::invalid_argument);
  EXPECT_THROW(comm_->all_to_all(sample(at::kFloat, {4, 2}), {4, 0}, {4, 0}),
               std::invalid_argument);
  at::Tensor data = sample(at::kFloat, {4});
  EXPECT_THROW(comm_->broadcast(data, 1), std::invalid_argument);
  EXPECT_THROW(comm_->all_gather(sample(at::kFloat, {4, 4}).t()), std::invalid_argument);
  EXPECT_THROW(comm_->all_gather(at::zeros({2}, at::kBool).to(kDevice)), std::invalid_argument);
  try {
    comm_->all_reduce_sum(bf16);
  } catch (const std::invalid_argument& error) {
    EXPECT_EQ(std::string(error.what()).rfind("t: all_reduce_sum", 0), 0u) << error.what();
  }
  EXPECT_EQ((thread_collective_stats() - before).total().calls, 0);
}

TEST_F(NcclOneRank, EveryCallIsCountedWithNoBytesAtOneRank) {
  const CollectiveStats before = thread_collective_stats();
  at::Tensor x = sample(at::kFloat, {8, 2});
  comm_->all_reduce_sum(x);
  comm_->all_gather(x);
  comm_->reduce_scatter_sum(x);
  comm_->all_to_all(x, {8}, {8});
  comm_->broadcast(x, 0);
  comm_->barrier();
  const CollectiveStats span = thread_collective_stats() - before;
  for (CollectiveOp op :
       {CollectiveOp::kAllReduce, CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
        CollectiveOp::kAllToAll, CollectiveOp::kBroadcast, CollectiveOp::kBarrier}) {
    SCOPED_TRACE(collective_op_name(op));
    EXPECT_EQ(span[op].calls, 1);
    EXPECT_EQ(span[op].bytes, 0);  // (n - 1) factors: nothing leaves a one-rank group
    EXPECT_GE(span[op].seconds, 0.0);
  }
}

// The collective reads its input after the work queued before it on the caller's current
// stream (here a side stream), and later work on that stream sees its result, with no host
// synchronisation in between: 64 Mi floats make a missing stream dependency visible.
TEST_F(NcclOneRank, FollowsTheCurrentStream) {
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard guard(side);
  at::Tensor input = at::empty({64 << 20}, at::TensorOptions().device(kDevice));
  input.fill_(3.0f);
  at::Tensor gathered = comm_->all_gather(input);
  gathered.mul_(2.0f);
  comm_->all_reduce_sum(gathered);
  gathered.add_(1.0f);
  EXPECT_EQ(gathered.min().item<float>(), 7.0f);
  EXPECT_EQ(gathered.max().item<float>(), 7.0f);
}

// Rank 1 of 2 whose rank 0 never comes: the communicator cannot be set up (its unique id never
// appears in the store), and the store's 2 s timeout makes that an error, not a hang.
TEST(NcclMissingPeer, TheFirstCollectiveFailsWithTheOpsUserError) {
  c10::cuda::set_device(0);
  TempDir dir;
  auto group =
      std::make_shared<NcclGroup>(file_store(dir.file("store"), 2, std::chrono::seconds(2)), 1, 2,
                                  kDevice, std::chrono::seconds(2));
  NcclCollectives comm(group, "lonely", 1);
  at::Tensor x = sample(at::kFloat, {4});
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    comm.all_reduce_sum(x);
  } catch (const UserError& error) {
    message = error.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(message.rfind("lonely: all_reduce_sum failed on rank 1: ", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_LT(seconds, 30.0);  // the 2 s store timeout plus set-up, far from a hang
}

TEST(NcclMissingPeer, ConnectingNowFailsWithADistError) {
  c10::cuda::set_device(0);
  TempDir dir;
  NcclGroup group(file_store(dir.file("store"), 2, std::chrono::seconds(2)), 1, 2, kDevice,
                  std::chrono::seconds(2));
  EXPECT_THROW(group.connect(), c10::DistError);
}

// Rank 0 of 2 whose rank 1 never comes: rank 0 publishes the unique id and enters NCCL's
// set-up, which in blocking mode waits for the peer in NCCL's bootstrap forever. The
// non-blocking communicator gives up after the group's timeout (3 s here) and is aborted:
// connect() throws a DistError well before 30 s. In a child process (a death test that must
// exit 0): c10d reads the non-blocking timeout once per process, and the other tests' groups
// have set it to theirs.
TEST(NcclMissingPeer, RankZeroGivesUpAfterTheTimeoutInsteadOfHanging) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        unsetenv("TORCH_NCCL_NONBLOCKING_TIMEOUT");
        c10::cuda::set_device(0);
        TempDir dir;
        const auto start = std::chrono::steady_clock::now();
        bool threw = false;
        {
          NcclGroup group(file_store(dir.file("store"), 2, std::chrono::seconds(3)), 0, 2, kDevice,
                          std::chrono::seconds(3));
          try {
            group.connect();
          } catch (const c10::DistError& error) {
            threw = true;
            std::fprintf(stderr, "connect: %s\n", first_line(error).c_str());
          }
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "threw %d after %.1f s\n", threw, seconds);
        std::_Exit(threw && seconds < 30.0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "threw 1 after");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
