// Which rank this process is, from the launcher's environment (docs/architecture.md §7, issue 4
// part 1).
//
// Checked in this order, the first present wins:
//   torchrun / mixtrain --nproc: RANK, WORLD_SIZE, LOCAL_RANK (default 0), LOCAL_WORLD_SIZE,
//             MASTER_ADDR, MASTER_PORT
//   Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//             OMPI_COMM_WORLD_LOCAL_SIZE
//   Slurm:    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (Slurm has no one-number local size)
//   none:     one process (rank 0 of 1, local rank 0 of 1).
// Without a local size the node holds at least local_rank + 1 ranks, and that is what
// local_world_size says (train.device = cuda checks it against the node's devices).
// MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500 for every launcher (Slurm and
// Open MPI jobs spanning machines must export MASTER_ADDR). A malformed or inconsistent value
// (non-integer, rank outside [0, world size), half of a launcher's variables) is a ConfigError
// naming the variable.
#pragma once

#include <string>

namespace mixtrain {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // ranks on this node
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "single";  // single | torchrun | slurm | openmpi | mixtrain
};

RankInfo detect_rank_info();

// Set by launch_local_workers in every worker it starts ("1").
inline constexpr const char* kLaunchedEnv = "MIXTRAIN_LAUNCHED";

}  // namespace mixtrain
