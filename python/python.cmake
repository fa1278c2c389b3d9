# The Python package `mixtrain` (docs/python.md), included by CMakeLists.txt.
#
# ${CMAKE_BINARY_DIR}/python/mixtrain holds the package: python/mixtrain/*.py (copied at build
# time), _build.py (the torch version it was built for) and the extension module _C
# (python/src/*.cpp: pybind11 as the torch wheel bundles it, torch's own tensor conversion from
# libtorch_python), which links the static module libraries. `make python` points .venv at that
# folder (a .pth file); the tests find it through PYTHONPATH.
#
# MIXTRAIN_PYTHON_PACKAGE ON (default) needs Python's headers (python3-dev, scripts/setup.sh):
# a configure error names them when they are missing; OFF builds no package.
option(MIXTRAIN_PYTHON_PACKAGE "build the Python package mixtrain (needs Python's headers)" ON)
if(NOT MIXTRAIN_PYTHON_PACKAGE)
  message(STATUS "mixtrain: no Python package (MIXTRAIN_PYTHON_PACKAGE=OFF)")
  return()
endif()

execute_process(
  COMMAND "${MIXTRAIN_PYTHON}" -c
          "import sysconfig, torch; print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX')); print(torch.__version__)"
  OUTPUT_VARIABLE python_answer OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE python_found)
string(REPLACE "\n" ";" python_answer "${python_answer}")
list(LENGTH python_answer python_answer_length)
if(NOT python_found EQUAL 0 OR NOT python_answer_length EQUAL 3)
  message(FATAL_ERROR "${MIXTRAIN_PYTHON} could not tell its include folder, extension suffix "
                      "and torch version")
endif()
list(GET python_answer 0 MIXTRAIN_PYTHON_INCLUDE)
list(GET python_answer 1 MIXTRAIN_PYTHON_EXT_SUFFIX)
list(GET python_answer 2 MIXTRAIN_PYTHON_TORCH_VERSION)
if(NOT EXISTS "${MIXTRAIN_PYTHON_INCLUDE}/Python.h")
  message(FATAL_ERROR "no Python.h in ${MIXTRAIN_PYTHON_INCLUDE} (the headers of "
                      "${MIXTRAIN_PYTHON}): install python3-dev (`make setup`), or configure "
                      "with -DMIXTRAIN_PYTHON_PACKAGE=OFF to build without the Python package")
endif()
find_library(MIXTRAIN_TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib"
             NO_DEFAULT_PATH REQUIRED)

set(package_dir "${CMAKE_BINARY_DIR}/python/mixtrain")
file(GLOB python_sources CONFIGURE_DEPENDS python/src/*.cpp)
add_library(mixtrain_python MODULE ${python_sources})
set_target_properties(mixtrain_python PROPERTIES
  OUTPUT_NAME _C PREFIX "" SUFFIX "${MIXTRAIN_PYTHON_EXT_SUFFIX}"
  LIBRARY_OUTPUT_DIRECTORY "${package_dir}"
  CXX_VISIBILITY_PRESET hidden)  # pybind11's advice: export only the module's init function
target_include_directories(mixtrain_python SYSTEM PRIVATE "${MIXTRAIN_PYTHON_INCLUDE}")
target_compile_options(mixtrain_python PRIVATE ${MIXTRAIN_WARNINGS})
target_compile_definitions(mixtrain_python PRIVATE
  MIXTRAIN_TORCH_VERSION="${MIXTRAIN_PYTHON_TORCH_VERSION}")
target_link_libraries(mixtrain_python PRIVATE mixtrain_trainer "${MIXTRAIN_TORCH_PYTHON_LIBRARY}")

# The package's Python files, copied when they change; _build.py from the configure step.
file(GLOB package_files CONFIGURE_DEPENDS python/mixtrain/*.py)
set(copied)
foreach(source ${package_files})
  get_filename_component(name ${source} NAME)
  add_custom_command(OUTPUT "${package_dir}/${name}"
                     COMMAND ${CMAKE_COMMAND} -E copy "${source}" "${package_dir}/${name}"
                     DEPENDS "${source}" VERBATIM)
  list(APPEND copied "${package_dir}/${name}")
endforeach()
file(WRITE "${CMAKE_BINARY_DIR}/mixtrain_build.py.in"
  "# Written by CMake (python/python.cmake): what this build of mixtrain was made with.\n"
  "VERSION = \"@PROJECT_VERSION@\"\nCOMMIT = \"@MIXTRAIN_COMMIT@\"\n"
  "TORCH_VERSION = \"@MIXTRAIN_PYTHON_TORCH_VERSION@\"\n")
configure_file("${CMAKE_BINARY_DIR}/mixtrain_build.py.in" "${package_dir}/_build.py" @ONLY)
add_custom_target(mixtrain_python_files ALL DEPENDS ${copied})
add_dependencies(mixtrain_python mixtrain_python_files)
message(STATUS "mixtrain: Python package in ${package_dir} (torch ${MIXTRAIN_PYTHON_TORCH_VERSION})")
