// Ctrl-C handling for the train loop: the first SIGINT/SIGTERM only raises a flag that the
// loop checks between steps, so the step in flight finishes and metrics are flushed. A second
// signal restores the default action (the user really wants out).
#pragma once

namespace mixtrain {

void install_interrupt_handler();
bool interrupt_requested();
void clear_interrupt();  // for tests

}  // namespace mixtrain
