# The C++ tests (included by CMakeLists.txt): one executable per test folder, one CTest entry per
# test file.
#
# tests/unit/<module>/*_test.cpp -> unit_<module>_tests (links mixtrain_<module>), tests/scenarios
# -> scenarios_tests and tests/tools -> tools_tests (link the whole trainer). A folder's
# *_cuda_test.cpp files form <folder>_cuda_tests with the CUDA main (support/cuda_test_main.cpp:
# exit 77, "Skipped", without a device), built in a CUDA build only: a CPU-only build has no
# test labelled cuda at all. CTest runs an executable once per file,
# `<exe> --test_file=tests/<folder>/<name>.cpp` (support/run_tests.h), as the test
# <folder>_<name> (e.g. unit_optim_adamw_test), so names, labels, timeouts and PROCESSORS stay
# per file (tests/ctest_properties.cmake). Linking ~15 executables instead of ~130 against
# LibTorch is most of what this saves (docs/development.md).
#
# Every test gets MIXTRAIN_SOURCE_DIR, MIXTRAIN_BINARY (the built mixtrain) and MIXTRAIN_PYTHON
# (the .venv python: transformers, tokenizers and torch as independent references).

# Test code is compiled at -O1 (the library keeps Release's -O3): a test file's compile is mostly
# generating code, and -O1 took 30% off it (tests/unit/optim/adamw_test.cpp 18.7 -> 14.6 s);
# the tests' heavy work runs in the library and LibTorch. Floating point is the same at every
# -O level here (no -ffast-math; -std=c++17 turns off FMA contraction).
set(MIXTRAIN_TEST_OPTIONS ${MIXTRAIN_WARNINGS} -O1)
set(MIXTRAIN_TEST_DEFINITIONS
  MIXTRAIN_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}"
  MIXTRAIN_BINARY="$<TARGET_FILE:mixtrain>"
  MIXTRAIN_PYTHON="${MIXTRAIN_PYTHON}")

# One precompiled header for every test (tests/support/test_pch.h: gtest, ATen and the standard
# headers most test files include). Parsing them was ~40% of a test file's compile; measured on
# tests/unit/optim/muon_test.cpp: 14.7 s -> 9.9 s of CPU. Built once, with the tests' flags.
add_library(mixtrain_test_pch OBJECT tests/support/test_pch.cpp)
target_compile_options(mixtrain_test_pch PRIVATE ${MIXTRAIN_TEST_OPTIONS})
target_include_directories(mixtrain_test_pch PRIVATE tests)
target_link_libraries(mixtrain_test_pch PRIVATE mixtrain_cli GTest::gtest)
target_compile_definitions(mixtrain_test_pch PRIVATE ${MIXTRAIN_TEST_DEFINITIONS})
if(MIXTRAIN_PCH)
  target_precompile_headers(mixtrain_test_pch PRIVATE tests/support/test_pch.h)
endif()

add_library(mixtrain_test_main STATIC tests/support/test_main.cpp)
target_include_directories(mixtrain_test_main PRIVATE tests)
target_link_libraries(mixtrain_test_main PUBLIC GTest::gtest)
if(MIXTRAIN_WITH_CUDA)
  add_library(mixtrain_cuda_test_main STATIC tests/support/cuda_test_main.cpp)
  target_include_directories(mixtrain_cuda_test_main PRIVATE tests)
  target_link_libraries(mixtrain_cuda_test_main PUBLIC GTest::gtest torch::cudart)
endif()

file(GLOB_RECURSE MIXTRAIN_TEST_SOURCES CONFIGURE_DEPENDS
  tests/unit/*_test.cpp tests/scenarios/*_test.cpp tests/tools/*_test.cpp)
set(MIXTRAIN_TESTS)
set(test_executables)
set(test_executable_table "")  # "<test> <executable>" lines: test_executables.txt below
foreach(test_source ${MIXTRAIN_TEST_SOURCES})
  file(RELATIVE_PATH rel ${CMAKE_CURRENT_SOURCE_DIR}/tests ${test_source})
  string(REGEX REPLACE "\\.cpp$" "" rel ${rel})
  string(REPLACE "/" "_" test_name ${rel})
  get_filename_component(folder ${rel} DIRECTORY)     # unit/optim, scenarios, tools
  string(REPLACE "/" "_" executable ${folder})
  set(cuda FALSE)
  if(test_name MATCHES "_cuda_test$")
    if(NOT MIXTRAIN_WITH_CUDA)
      continue()
    endif()
    set(cuda TRUE)
    string(APPEND executable "_cuda")
  endif()
  string(APPEND executable "_tests")
  if(NOT TARGET ${executable})
    add_executable(${executable})
    list(APPEND test_executables ${executable})
    if(MIXTRAIN_PCH)
      target_precompile_headers(${executable} REUSE_FROM mixtrain_test_pch)
    endif()
    target_compile_options(${executable} PRIVATE ${MIXTRAIN_TEST_OPTIONS})
    target_include_directories(${executable} PRIVATE tests)
    target_compile_definitions(${executable} PRIVATE ${MIXTRAIN_TEST_DEFINITIONS})
    # Unity batches (MIXTRAIN_UNITY): a test file keeps its helpers and tests in
    # `namespace MIXTRAIN_FILE_LOCAL {`, a name unique to the file in a unity batch (CMake's
    # UNITY_BUILD_UNIQUE_ID) and empty, i.e. an anonymous namespace, otherwise; so files of one
    # batch may use the same helper names.
    mixtrain_unity(${executable})
    if(MIXTRAIN_UNITY)
      set_target_properties(${executable} PROPERTIES UNITY_BUILD_UNIQUE_ID MIXTRAIN_FILE_LOCAL)
    else()
      target_compile_definitions(${executable} PRIVATE MIXTRAIN_FILE_LOCAL=)
    endif()
    # tests/unit/<module>/ links that module; scenario and tool tests link the whole trainer. The
    # distributed tests also build the optimizer on the sharded model, as the trainer does; the
    # model tests also load Hugging Face directories (checkpoint/hf_import).
    set(test_libs mixtrain_cli)
    if(folder MATCHES "^unit/([a-z_]+)$")
      set(test_libs mixtrain_${CMAKE_MATCH_1})
      # Tests that read or build a config need the sections model/ and optim/ register.
      if(CMAKE_MATCH_1 MATCHES "^(distributed|config|model|optim)$")
        list(APPEND test_libs mixtrain_model mixtrain_optim)
      endif()
      if(CMAKE_MATCH_1 STREQUAL "model")
        list(APPEND test_libs mixtrain_checkpoint)
      endif()
    endif()
    # Executables that can read a config register the models' and optimizers' sections first,
    # as run_cli does (config/section.h); the core, data and checkpoint tests read none.
    if(NOT folder MATCHES "^unit/(core|data|checkpoint)$")
      target_sources(${executable} PRIVATE tests/support/register_sections.cpp)
    endif()
    if(cuda)
      target_link_libraries(${executable} PRIVATE ${test_libs} mixtrain_cuda_test_main)
    else()
      target_link_libraries(${executable} PRIVATE ${test_libs} mixtrain_test_main)
    endif()
    if(folder STREQUAL "tools")  # command-line tests drive the built binary
      add_dependencies(${executable} mixtrain)
    endif()
  endif()
  target_sources(${executable} PRIVATE ${test_source})
  # Loading LibTorch costs ~1-2 s per process, so a test file's cases share one process.
  add_test(NAME ${test_name}
           COMMAND ${executable} --gtest_color=no --test_file=tests/${rel}.cpp)
  string(REGEX REPLACE "/.*" "" label ${rel})
  string(REPLACE "scenarios" "scenario" label ${label})  # labels: unit | scenario | tools
  set_tests_properties(${test_name} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" LABELS ${label})
  if(cuda)
    set_tests_properties(${test_name} PROPERTIES LABELS "${label};cuda" SKIP_RETURN_CODE 77)
  endif()
  list(APPEND MIXTRAIN_TESTS ${test_name})
  string(APPEND test_executable_table "${test_name} ${executable}\n")
endforeach()
add_custom_target(test_executables DEPENDS ${test_executables})
# Which executable runs each test, known before anything is built (ctest's JSON names a test's
# command only once its executable exists): scripts/device_check.sh builds just what it runs.
file(WRITE ${CMAKE_BINARY_DIR}/test_executables.txt "${test_executable_table}")
