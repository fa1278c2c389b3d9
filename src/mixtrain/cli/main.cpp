#include "mixtrain/cli/cli.h"

int main(int argc, char** argv) {
  return mixtrain::run_cli(argc, argv);
}
