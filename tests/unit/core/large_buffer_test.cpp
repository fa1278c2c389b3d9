// core/large_buffer.h: mappings of their own, 2 MiB aligned when asked, zero-filled, as tensors.
#include "mixtrain/core/large_buffer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <system_error>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

bool all_zero(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  return std::all_of(p, p + bytes, [](unsigned char b) { return b == 0; });
}

uintptr_t address(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

TEST(LargeBufferTest, HugePageMappingsAreAlignedZeroedAndWritable) {
  for (const size_t bytes : {size_t{1}, size_t{3} << 20, (size_t{4} << 20) + 1}) {
    c10::DataPtr data = map_anonymous(bytes, HugePages::kAligned);
    ASSERT_TRUE(data) << bytes;
    EXPECT_EQ(address(data.get()) % kHugePageBytes, 0u) << bytes;
    EXPECT_TRUE(all_zero(data.get(), bytes)) << bytes;
    std::memset(data.get(), 0xab, bytes);  // every byte asked for is there
    EXPECT_EQ(static_cast<unsigned char*>(data.get())[bytes - 1], 0xab);
  }
}

TEST(LargeBufferTest, PlainMappingsArePageAlignedAndZeroed) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (const size_t bytes : {size_t{0}, size_t{1}, size_t{100000}}) {
    c10::DataPtr data = map_anonymous(bytes, HugePages::kNo);
    ASSERT_TRUE(data) << bytes;  // 0 bytes still maps one
    EXPECT_EQ(address(data.get()) % page, 0u);
    EXPECT_TRUE(all_zero(data.get(), std::max<size_t>(bytes, 1)));
  }
}

TEST(LargeBufferTest, RefusedMappingIsANullPointer) {
  // More than any address space: the kernel refuses, and errno says why.
  errno = 0;
  const c10::DataPtr data = map_anonymous(size_t{1} << 62, HugePages::kNo);
  EXPECT_FALSE(data);
  EXPECT_EQ(errno, ENOMEM);
  try {
    empty_mapped({int64_t{1} << 60}, at::kFloat, HugePages::kNo);
    ADD_FAILURE() << "no error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOMEM);
  }
}

TEST(LargeBufferTest, MappedTensorsAreContiguousAndOwnTheirMapping) {
  at::Tensor t = empty_mapped({3, 5}, at::TensorOptions().dtype(at::kDouble), HugePages::kNo);
  EXPECT_EQ(t.sizes(), at::IntArrayRef({3, 5}));
  EXPECT_EQ(t.strides(), at::IntArrayRef({5, 1}));
  EXPECT_EQ(t.scalar_type(), at::kDouble);
  EXPECT_EQ(t.storage().nbytes(), 15u * sizeof(double));
  EXPECT_TRUE(all_zero(t.data_ptr(), t.nbytes()));
  t.fill_(2.5);
  EXPECT_EQ(t.sum().item<double>(), 37.5);

  const at::Tensor empty = empty_mapped({0, 4}, at::TensorOptions(), HugePages::kNo);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.storage().nbytes(), 0u);
}

TEST(LargeBufferTest, LargeBuffersAreHugePageMappingsFromFourMiB) {
  // 4 MiB of float32 and more: a 2 MiB-aligned zeroed mapping (the heap never gives that
  // alignment to a block of this size: its large blocks start 16 or 64 bytes into a mapping).
  const at::Tensor large = empty_large_buffer({1 << 20, 2}, at::kFloat);
  EXPECT_EQ(large.sizes(), at::IntArrayRef({1 << 20, 2}));
  EXPECT_EQ(large.scalar_type(), at::kFloat);
  EXPECT_TRUE(large.is_contiguous());
  EXPECT_EQ(address(large.data_ptr()) % kHugePageBytes, 0u);
  EXPECT_TRUE(all_zero(large.data_ptr(), large.nbytes()));

  // Below 4 MiB: the default CPU allocator's memory.
  const at::Tensor small = empty_large_buffer({1000}, at::kFloat);
  EXPECT_EQ(small.storage().data_ptr().get_deleter(),
            c10::GetDefaultCPUAllocator()->allocate(1).get_deleter());
  EXPECT_NE(large.storage().data_ptr().get_deleter(), small.storage().data_ptr().get_deleter());
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
