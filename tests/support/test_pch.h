// The tests' precompiled header (CMakeLists.txt): the heavy headers most test files include.
// Only headers from outside the project, so editing mixtrain never rebuilds it.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
