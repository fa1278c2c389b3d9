// `mixtrain ckpt inspect|verify|diff` (docs/cli.md): look into checkpoints written by the
// trainer. Each path is a step directory or a checkpoint directory with `latest`. Output goes
// to stdout; bad input (missing directory, corrupt metadata or files) throws DataError, which
// the CLI reports as one error and exit code 1.
#pragma once

#include <optional>
#include <string>

namespace mixtrain {

// Step, world size, mesh, one line per tensor (dtype, shape, bytes, chunks), the state keys.
int ckpt_inspect_command(const std::string& path);
// Checks every file and checksum: 0 and "ok: N chunks in M files", or 1 and one line per bad
// chunk.
int ckpt_verify_command(const std::string& path);
// Compares two checkpoints as global tensors (their world sizes may differ). 0 when they are
// identical (tensors bitwise, step and state equal), or with `atol` when every tensor's max
// abs difference is <= atol and keys, dtypes and shapes match; 1 otherwise.
int ckpt_diff_command(const std::string& a, const std::string& b, std::optional<double> atol);

}  // namespace mixtrain
