// main() of the test executables (tests/tests.cmake): the tests of one folder, selected per
// file (support/run_tests.h).
#include "support/run_tests.h"

int main(int argc, char** argv) {
  return mixtrain::testing::run_selected_tests(argc, argv);
}
