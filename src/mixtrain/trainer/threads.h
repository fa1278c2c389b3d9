// How many intra-op threads a training process computes on, and the warning for cores that
// other processes keep busy.
//
// OpenMP's threads wait for each other at the end of every parallel region. On cores that other
// processes keep busy, a descheduled peer holds the rest up for a scheduler time slice each
// time: with one of two cores busy, a step on 2 threads took 3x the step on 1 thread
// (bench/README.md, "Intra-op threads on a busy machine"). Nothing cheap can see that coming
// except the load average before training starts, so the trainer says what helps.
#pragma once

#include <string>

namespace mixtrain {

// Every usable core (the cores this process may run on, counted as the launcher counts them
// when it gives N local workers cores/N each), unless OMP_NUM_THREADS is set.
void configure_threads();

// The warning for `threads` intra-op threads per rank when the 1-minute load average before
// training is `load_average` on `usable_cores` cores; empty when there is nothing to say
// (one thread, or a load average below 1: no other process kept a core busy).
std::string busy_cores_warning(double load_average, int threads, int usable_cores);

// busy_cores_warning() for this process (its threads, /proc/loadavg), logged when non-empty.
void warn_if_cores_are_busy();

}  // namespace mixtrain
