#include "mixtrain/core/large_buffer.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/accumulate.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <new>
#include <system_error>

namespace mixtrain {
namespace {

struct Mapping {
  void* data;
  size_t size;
};

void unmap(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  ::munmap(mapping->data, mapping->size);
  delete mapping;
}

// Over-maps by one huge page and trims, so that the mapping starts on a 2 MiB boundary.
void* map_huge_page_aligned(size_t size) {
  void* raw = ::mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (aligned > begin) ::munmap(raw, aligned - begin);
  if (const uintptr_t tail = begin + kHugePageBytes - aligned; tail > 0) {
    ::munmap(reinterpret_cast<void*>(aligned + size), tail);
  }
  void* data = reinterpret_cast<void*>(aligned);
  ::madvise(data, size, MADV_HUGEPAGE);  // best effort: EINVAL without THP support
  return data;
}

// From 4 MiB up: huge-page mappings; below, the default CPU allocator.
class LargeBufferAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    if (bytes < kMinBytes) return c10::GetDefaultCPUAllocator()->allocate(bytes);
    c10::DataPtr data = map_anonymous(bytes, HugePages::kAligned);
    if (!data) throw std::bad_alloc();
    return data;
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Never destroyed: a tensor's storage points at its allocator, and tensors may outlive main.
  static c10::Allocator* get() {
    static LargeBufferAllocator* allocator = new LargeBufferAllocator();
    return allocator;
  }

 private:
  static constexpr size_t kMinBytes = size_t{4} << 20;
};

}  // namespace

c10::DataPtr map_anonymous(size_t bytes, HugePages huge_pages) {
  size_t size = std::max<size_t>(bytes, 1);
  void* data = nullptr;
  if (huge_pages == HugePages::kAligned) {
    size = (size + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
    data = map_huge_page_aligned(size);
  } else {
    data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) data = nullptr;
  }
  if (data == nullptr) return {};
  return {data, new Mapping{data, size}, &unmap, c10::Device(c10::DeviceType::CPU)};
}

at::Tensor empty_mapped(at::IntArrayRef sizes, const at::TensorOptions& options,
                        HugePages huge_pages) {
  at::Tensor t = at::empty({0}, options.device(c10::kCPU));
  const size_t bytes = static_cast<size_t>(c10::multiply_integers(sizes)) * t.element_size();
  c10::DataPtr data = map_anonymous(bytes, huge_pages);
  if (!data) throw std::system_error(errno, std::generic_category(), "mmap");
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(data),
                       /*allocator=*/nullptr, /*resizable=*/false);
  t.set_(storage, 0, sizes);  // no strides: contiguous
  return t;
}

at::Tensor empty_large_buffer(at::IntArrayRef sizes, c10::ScalarType dtype) {
  return at::Tensor(at::detail::empty_generic(sizes, LargeBufferAllocator::get(),
                                              c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                              c10::nullopt));
}

}  // namespace mixtrain
