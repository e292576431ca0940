// Scratch floats that start on a cache line (64 bytes), so that no vector load of a row whose
// stride is a multiple of 16 floats splits one. Included by the generic translation units only
// (not the ISA files: see kernel.h).
#pragma once

#include <cstdint>
#include <vector>

namespace edgespec_native {

// The first 64-byte-aligned float of `room`, grown (never shrunk) to hold `n` floats from there.
inline float* aligned_room(std::vector<float>& room, int64_t n) {
  if (static_cast<int64_t>(room.size()) < n + 16) room.resize(static_cast<size_t>(n + 16));
  return room.data() + (16 - reinterpret_cast<uintptr_t>(room.data()) / 4 % 16) % 16;
}

}  // namespace edgespec_native
