// What machine a benchmark ran on, for the figures it prints: the CPU model, the memory, and
// the filesystem of a directory (a checkpoint or swap file on tmpfs never reaches a disk).
// Header-only; the bench programs are one file each.
#pragma once

#include <sys/statfs.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace mixtrain::bench {

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

// MemTotal in KiB; -1 when /proc/meminfo does not say.
inline long mem_total_kib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long value = 0;
  while (in >> key >> value) {
    if (key == "MemTotal:") return value;
    in.ignore(1 << 10, '\n');
  }
  return -1;
}

inline std::string filesystem_of(const std::string& path) {
  struct statfs st {};
  if (statfs(path.c_str(), &st) != 0) return "unknown";
  struct Known {
    unsigned long magic;
    const char* name;
  };
  const Known known[] = {
      {0xEF53, "ext4 (ext2/3/4)"},
      {0x01021994, "tmpfs (RAM: nothing reaches a disk)"},
      {0x58465342, "xfs"},
      {0x9123683E, "btrfs"},
      {0x794C7630, "overlay"},
      {0x6969, "nfs"},
      {0x2FC12FC1, "zfs"},
      {0x65735546, "fuse"},
      {0x858458F6, "ramfs (RAM: nothing reaches a disk)"},
  };
  for (const Known& k : known) {
    if (static_cast<unsigned long>(st.f_type) == k.magic) return k.name;
  }
  char hex[32];
  std::snprintf(hex, sizeof(hex), "f_type 0x%lx", static_cast<unsigned long>(st.f_type));
  return hex;
}

}  // namespace mixtrain::bench
