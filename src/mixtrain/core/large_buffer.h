// Memory for large buffers as anonymous mappings of their own, never the malloc heap: freeing
// one returns it to the system at once. Used for buffers written once, right after they are
// allocated: loaded checkpoint chunks and an async save's snapshot (checkpoint/), and
// swapped-in optimizer state (optim/state_swap). Measured with bench/checkpoint_io.cpp on a
// 2-core VM:
//  - loading into fresh 4 KiB pages ran at the first-touch rate of fresh memory there,
//    200-350 MB/s, a tenth of the disk's read rate;
//  - an async snapshot taken from the malloc heap took the memory that the training step's
//    temporaries are recycled from, so every step while the save was in flight faulted its
//    temporaries in anew (~240,000 page faults, the step 2-3x slower).
// Hence huge pages (HugePages::kAligned): the mapping is 2 MiB aligned and a whole number of
// 2 MiB, with madvise(MADV_HUGEPAGE) (as PyTorch 2.x's THP_MEM_ALLOC_ENABLE does for its CPU
// allocator): one page fault per 2 MiB where transparent huge pages are on (`always` or
// `madvise`), plain pages otherwise. The memory of a fresh mapping reads as zeros.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstddef>

namespace mixtrain {

constexpr size_t kHugePageBytes = size_t{2} << 20;

enum class HugePages { kNo, kAligned };

// A private anonymous read-write mapping of `bytes` (at least 1), unmapped when the DataPtr
// dies. A null DataPtr, with errno set, when the kernel refuses.
c10::DataPtr map_anonymous(size_t bytes, HugePages huge_pages);

// An uninitialized contiguous CPU tensor whose storage is a map_anonymous mapping.
// std::system_error with the errno of mmap when the kernel refuses the mapping.
at::Tensor empty_mapped(at::IntArrayRef sizes, const at::TensorOptions& options,
                        HugePages huge_pages);

// An uninitialized CPU tensor for bytes written once right after it is allocated (loaded
// chunks, an async save's snapshot). From 4 MiB up its memory is a map_anonymous mapping with
// huge pages, unmapped when the tensor dies; smaller ones come from the default CPU allocator.
at::Tensor empty_large_buffer(at::IntArrayRef sizes, c10::ScalarType dtype);

}  // namespace mixtrain
