// Registers the optimizers' config sections (optim/optimizer_table.h) before any test runs, as
// the binary's run_cli does: a source of every test executable that links optim/
// (tests/tests.cmake), so the linker keeps it.
#include "mixtrain/optim/optimizer_table.h"

namespace {
const bool kOptimizerSectionsRegistered = (mixtrain::register_optimizer_sections(), true);
}  // namespace
