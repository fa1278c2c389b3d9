#include "mixtrain/trainer/interrupt.h"

#include <csignal>

namespace mixtrain {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_interrupt(int signal) {
  if (g_interrupted) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  g_interrupted = 1;
}

}  // namespace

void install_interrupt_handler() {
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
}

bool interrupt_requested() {
  return g_interrupted != 0;
}
void clear_interrupt() {
  g_interrupted = 0;
}

}  // namespace mixtrain
