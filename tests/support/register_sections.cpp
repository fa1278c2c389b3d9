// Registers the models' and the optimizers' config sections (model/registry.h,
// optim/optimizer_table.h) before any test runs, as the binary's run_cli does: a source of every
// test executable that links model/ and optim/ (tests/tests.cmake), so the linker keeps it.
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/optimizer_table.h"

namespace {
const bool kSectionsRegistered =
    (mixtrain::register_model_sections(), mixtrain::register_optimizer_sections(), true);
}  // namespace
