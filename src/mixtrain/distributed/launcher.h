// Local worker processes: `mixtrain train --nproc N` (docs/architecture.md §7, issue 4 parts 1-2).
//
// Workers are the binary itself, re-executed (/proc/self/exe), never a bare fork: OpenMP and
// Gloo threads do not survive fork. Each worker gets RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a reserved port, below>,
// MIXTRAIN_LAUNCHED=1 and,
// unless already set, OMP_NUM_THREADS = max(1, cores / N). Workers die with the launcher
// (PR_SET_PDEATHSIG), so even a SIGKILLed launcher leaves no orphan.
//
// Failure policy: when a worker exits non-zero or by a signal, the launcher logs which rank and
// how, gives the others a short drain period to exit by themselves (their Gloo ops fail at once
// on a closed connection, or after distributed.timeout_s on a hung peer, and they print why),
// then SIGTERMs the rest and SIGKILLs what is left after a grace period. SIGINT/SIGTERM sent to
// the launcher are forwarded to the workers. Every worker is reaped before returning.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mixtrain {

// Starts `nproc` workers running `argv` (argv[0] is the program name shown to the worker; the
// caller has removed --nproc), waits for all, returns 0 iff every worker exited with 0; else the
// exit code every failed worker exited with when they agree (a config or checkpoint error all
// ranks found: 2), otherwise 1.
// `timeout_s` is distributed.timeout_s: the drain period after a failure is min(timeout_s, 2 s).
int launch_local_workers(int nproc, const std::vector<std::string>& argv, double timeout_s);

// --- building blocks, also used by the multi-process test harness --------------------------

// A TCP port on 127.0.0.1 for rank 0's store (MASTER_PORT), kept from the moment it is chosen
// until this object is destroyed, so that nothing else can take it before rank 0 binds it.
// (Binding port 0, reading the port and closing the socket left a window between the close and
// rank 0's bind in which a parallel job could get the port: rank 0 then failed with "address
// already in use", or worse, the other ranks joined that job's store.)
//
// How: the constructor binds a socket to 127.0.0.1:0 with SO_REUSEADDR and never listens on it.
// While it is bound, Linux hands the port to no one else: bind(port 0) and connect()'s choice of
// a local port skip a port that has a bound socket, and an explicit bind to it without
// SO_REUSEADDR fails with EADDRINUSE. Rank 0's store still binds and listens on it: c10d's TCP
// stores set SO_REUSEADDR (the libuv server through uv_tcp_bind, the legacy server itself), and
// Linux lets a listening SO_REUSEADDR socket share a port with SO_REUSEADDR sockets that are only
// bound. What this cannot stop: another program that binds this very port with SO_REUSEADDR and
// listens before rank 0 does (a server configured for a fixed port inside the ephemeral range).
// The socket is close-on-exec: workers do not inherit it. Throws UserError if no port is free.
class ReservedPort {
 public:
  ReservedPort();
  ~ReservedPort();
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct WorkerSpec {
  std::vector<std::string> argv;           // argv[0] is the displayed name; exe is /proc/self/exe
  std::map<std::string, std::string> env;  // added to (overriding) the launcher's environment
  std::string output_path;                 // stdout+stderr go here; empty: inherited
  // The reservation of env's MASTER_PORT, if the caller made one: specs built together share
  // it, and it lasts as long as they do (run_worker_processes takes them by reference).
  std::shared_ptr<const ReservedPort> reserved_port;
};

struct WorkerOutcome {
  pid_t pid = -1;
  int exit_code = -1;                // valid when signal == 0
  int signal = 0;                    // the signal that ended the worker, 0 if it exited
  bool stopped_by_launcher = false;  // SIGTERM/SIGKILL came from the launcher (after a failure)
  double seconds = 0;                // from start until reaped
  bool ok() const { return signal == 0 && exit_code == 0; }
  std::string describe() const;  // "exited with code 1", "killed by signal 9 (SIGKILL)"
};

struct LaunchOptions {
  double drain_s = 2.0;         // after the first failure, before SIGTERM to the others
  double kill_grace_s = 3.0;    // after SIGTERM, before SIGKILL
  double deadline_s = 0.0;      // > 0: treat workers still running after this as failed
  bool forward_signals = true;  // forward SIGINT/SIGTERM received meanwhile
  bool log_failures = true;     // log each failed rank (mixtrain logging, stderr)
};

// Starts one process per spec (index = rank), applies the failure policy above, reaps all.
// Throws UserError if a process cannot be started (after stopping the ones already started).
std::vector<WorkerOutcome> run_worker_processes(const std::vector<WorkerSpec>& workers,
                                                const LaunchOptions& options);

// max(1, usable cores / nproc): the intra-op threads per local worker.
int threads_per_worker(int nproc);

}  // namespace mixtrain
