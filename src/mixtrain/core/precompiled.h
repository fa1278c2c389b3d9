// The library's precompiled header (CMakeLists.txt, MIXTRAIN_PCH): the LibTorch and standard
// headers most of src/ includes. Parsing them was most of a source file's compile (ATen.h alone
// ~5 s, torch/nn/module.h ~8 s of CPU on the 2-core VM; docs/development.md). Only headers from
// outside the project, so editing mixtrain never rebuilds it. Every file still includes what it
// uses: a build with -DMIXTRAIN_PCH=OFF checks that.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
