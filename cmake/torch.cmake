# LibTorch from the torch wheel, with CUDA or CPU-only (docs/development.md, "CMake options").
#
# In:  MIXTRAIN_PYTHON     a python whose torch package is LibTorch (>= 2.11)
#      MIXTRAIN_CUDA       AUTO (default): CUDA when a CUDA compiler of the wheel's CUDA major
#                          version is found, else CPU-only; ON: CUDA or a configure error saying
#                          what to install; OFF: CPU-only even where a toolkit exists
# Out: TORCH_LIBRARIES, TORCH_INSTALL_PREFIX, MIXTRAIN_NVIDIA_LIB_DIRS (the wheel's nvidia-*
#      library folders), MIXTRAIN_WITH_CUDA (ON|OFF), MIXTRAIN_BUILD_KIND (one line for
#      `mixtrain version`: the kind of build and why); in a CUDA build the CUDA language is
#      enabled and torch::cudart names the wheel's CUDA runtime.
#
# A CUDA build goes through the wheel's own CMake config (TorchConfig), which needs the CUDA
# toolkit. A CPU-only build imports the wheel's CPU libraries (libtorch_cpu, libc10) and headers
# directly: TorchConfig of a CUDA wheel cannot be told to leave CUDA out. Nothing is downloaded.

set(MIXTRAIN_CUDA AUTO CACHE STRING "CUDA kernels and NCCL: AUTO (if a toolkit is found), ON, OFF")
set_property(CACHE MIXTRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${MIXTRAIN_CUDA}" mixtrain_cuda_request)
if(NOT mixtrain_cuda_request MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MIXTRAIN_CUDA=${MIXTRAIN_CUDA}: expected AUTO, ON or OFF")
endif()

execute_process(
  COMMAND "${MIXTRAIN_PYTHON}" -c
          "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE torch_answer OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE torch_found ERROR_QUIET)
if(NOT torch_found EQUAL 0)
  message(FATAL_ERROR "no torch package in ${MIXTRAIN_PYTHON}: run `make setup` "
                      "(scripts/setup.sh) or set -DMIXTRAIN_PYTHON=<python with torch>")
endif()
string(REPLACE "\n" ";" torch_answer "${torch_answer}")
list(GET torch_answer 0 MIXTRAIN_TORCH_PREFIX)
set(wheel_cuda "")
list(LENGTH torch_answer torch_answer_length)
if(torch_answer_length GREATER 1)
  list(GET torch_answer 1 wheel_cuda)
endif()
get_filename_component(TORCH_INSTALL_PREFIX "${MIXTRAIN_TORCH_PREFIX}/../.." ABSOLUTE)
set(MIXTRAIN_TORCH_LIB_DIR "${TORCH_INSTALL_PREFIX}/lib")

# The wheel's nvidia-* packages (nvidia/<package>/lib: CUDA runtime, NCCL, cuBLAS, ...), beside
# torch or anywhere on that Python's sys.path, where torch itself looks for them. A CUDA wheel's
# libtorch_cpu needs libcudart and libcupti from there even in a CPU-only build: the linker
# resolves them there (-rpath-link), never in a system CUDA toolkit; at run time LibTorch's own
# RUNPATH finds them.
execute_process(
  COMMAND "${MIXTRAIN_PYTHON}" -c
          "import glob, os, sys; print(';'.join(dict.fromkeys(d for p in sys.path if p for d in sorted(glob.glob(os.path.join(glob.escape(p), 'nvidia', '*', 'lib'))))))"
  OUTPUT_VARIABLE MIXTRAIN_NVIDIA_LIB_DIRS OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
get_filename_component(site_packages "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
file(GLOB beside_torch LIST_DIRECTORIES true "${site_packages}/nvidia/*/lib")
list(PREPEND MIXTRAIN_NVIDIA_LIB_DIRS ${beside_torch})
list(REMOVE_DUPLICATES MIXTRAIN_NVIDIA_LIB_DIRS)
foreach(dir ${MIXTRAIN_NVIDIA_LIB_DIRS})
  add_link_options("LINKER:-rpath-link,${dir}")
endforeach()

# --- which kind of build -------------------------------------------------------------------
set(MIXTRAIN_WITH_CUDA OFF)
set(install_hint "install the CUDA ${wheel_cuda} toolkit (nvcc and headers) and put its bin/ on "
                 "PATH or set CUDACXX=<its nvcc>, or configure with -DMIXTRAIN_CUDA=OFF")
string(CONCAT install_hint ${install_hint})
if(mixtrain_cuda_request STREQUAL "OFF")
  set(MIXTRAIN_BUILD_KIND "CPU-only (configured with MIXTRAIN_CUDA=OFF)")
elseif(wheel_cuda STREQUAL "")
  set(why "the torch wheel in ${MIXTRAIN_PYTHON} is a CPU-only build")
  if(mixtrain_cuda_request STREQUAL "ON")
    message(FATAL_ERROR "MIXTRAIN_CUDA=ON, but ${why}: install the CUDA wheel of the same "
                        "version, or configure with -DMIXTRAIN_CUDA=OFF")
  endif()
  set(MIXTRAIN_BUILD_KIND "CPU-only (MIXTRAIN_CUDA=AUTO: ${why})")
else()
  include(CheckLanguage)
  check_language(CUDA)
  set(nvcc_release "")
  if(CMAKE_CUDA_COMPILER)
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --version OUTPUT_VARIABLE nvcc_text
                    ERROR_QUIET)
    if(nvcc_text MATCHES "release ([0-9]+\\.[0-9]+)")
      set(nvcc_release "${CMAKE_MATCH_1}")
    endif()
  endif()
  string(REGEX REPLACE "\\..*" "" wheel_major "${wheel_cuda}")
  string(REGEX REPLACE "\\..*" "" nvcc_major "${nvcc_release}")
  if(NOT CMAKE_CUDA_COMPILER)
    set(why "no CUDA compiler (nvcc) found")
  elseif(NOT nvcc_major STREQUAL wheel_major)
    set(why "${CMAKE_CUDA_COMPILER} is CUDA '${nvcc_release}', the torch wheel is CUDA ${wheel_cuda}")
  else()
    set(why "")
  endif()
  if(why STREQUAL "")
    set(MIXTRAIN_WITH_CUDA ON)
    set(MIXTRAIN_BUILD_KIND
        "CUDA ${nvcc_release} (MIXTRAIN_CUDA=${mixtrain_cuda_request}, nvcc ${CMAKE_CUDA_COMPILER})")
  elseif(mixtrain_cuda_request STREQUAL "ON")
    message(FATAL_ERROR "MIXTRAIN_CUDA=ON, but ${why}: ${install_hint}")
  else()
    set(MIXTRAIN_BUILD_KIND "CPU-only (MIXTRAIN_CUDA=AUTO: ${why} at configure time)")
  endif()
endif()
message(STATUS "mixtrain: ${MIXTRAIN_BUILD_KIND}")

# --- CPU-only: the wheel's CPU libraries and headers, as imported targets -------------------
if(NOT MIXTRAIN_WITH_CUDA)
  foreach(name c10 torch_cpu)
    find_library(MIXTRAIN_${name}_LIBRARY ${name} PATHS "${MIXTRAIN_TORCH_LIB_DIR}"
                 NO_DEFAULT_PATH REQUIRED)
  endforeach()
  add_library(mixtrain::c10 SHARED IMPORTED)
  set_target_properties(mixtrain::c10 PROPERTIES IMPORTED_LOCATION "${MIXTRAIN_c10_LIBRARY}")
  # What the wheel's torch_cpu target carries (share/cmake/Caffe2/Caffe2Targets.cmake).
  add_library(mixtrain::torch_cpu SHARED IMPORTED)
  set_target_properties(mixtrain::torch_cpu PROPERTIES
    IMPORTED_LOCATION "${MIXTRAIN_torch_cpu_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES
      "${TORCH_INSTALL_PREFIX}/include;${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO;USE_RPC;USE_TENSORPIPE"
    INTERFACE_LINK_LIBRARIES mixtrain::c10)
  set(TORCH_LIBRARIES mixtrain::torch_cpu)
  if(EXISTS "${TORCH_INSTALL_PREFIX}/include/torch/version.h")
    file(STRINGS "${TORCH_INSTALL_PREFIX}/include/torch/version.h" torch_version_line
         REGEX "#define TORCH_VERSION \"")
    message(STATUS "mixtrain: LibTorch (CPU libraries) ${torch_version_line}")
  endif()
  return()
endif()

# --- CUDA: the wheel's TorchConfig --------------------------------------------------------
# TorchConfig finds its libraries with the system paths first: name the wheel's, so that a
# LibTorch installed elsewhere (Debian's libtorch-dev) is never mixed in.
list(APPEND CMAKE_PREFIX_PATH "${MIXTRAIN_TORCH_PREFIX}")
foreach(pair TORCH_LIBRARY:torch c10_LIBRARY:c10 C10_CUDA_LIBRARY:c10_cuda
             CAFFE2_NVRTC_LIBRARY:caffe2_nvrtc)
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 variable)
  list(GET pair 1 name)
  find_library(${variable} ${name} PATHS "${MIXTRAIN_TORCH_LIB_DIR}" NO_DEFAULT_PATH)
endforeach()
# The wheel links kineto (the profiler) into libtorch_cpu and ships no libkineto; name that library
# so TorchConfig does not warn "library kineto not found".
set(kineto_LIBRARY "${MIXTRAIN_TORCH_LIB_DIR}/libtorch_cpu.so" CACHE FILEPATH
    "kineto is inside the wheel's libtorch_cpu")
# The CUDA wheel's config autodetects GPU architectures; name the H100/H200's to keep it quiet
# and deterministic (no device code is compiled from it here).
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0")
endif()
# CMP0104 OLD: enabling CUDA (TorchConfig does) leaves CMAKE_CUDA_ARCHITECTURES unset, which
# TorchConfig wants (it warns otherwise); our CUDA targets name theirs (CUDA_ARCHITECTURES).
cmake_policy(SET CMP0104 OLD)
find_package(Torch 2.11 REQUIRED)
# The device kernels (kernels/*.cu beside their CPU twins) link the CUDA runtime LibTorch's
# targets link (torch::cudart: below, the wheel's libcudart.so.13, the one libtorch_cuda loads,
# where the wheel has it; else the toolkit's).
# MIXTRAIN_CUDA_ARCHITECTURES: Hopper (H100/H200) by default; e.g. "80;90" adds Ampere.
set(MIXTRAIN_CUDA_ARCHITECTURES "90" CACHE STRING "GPU architectures the CUDA kernels are built for")
set(CMAKE_CUDA_RUNTIME_LIBRARY None)
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_library(MIXTRAIN_CUDART NAMES libcudart.so.13 PATHS ${MIXTRAIN_NVIDIA_LIB_DIRS} NO_DEFAULT_PATH)
find_library(MIXTRAIN_NVRTC NAMES libnvrtc.so.13 PATHS ${MIXTRAIN_NVIDIA_LIB_DIRS} NO_DEFAULT_PATH)
if(MIXTRAIN_CUDART AND MIXTRAIN_NVRTC)
  # TorchConfig names the toolkit's for every target using LibTorch (torch::cudart, CUDA_NVRTC_LIB
  # in TORCH_LIBRARIES): the wheel's instead, the copies libtorch_cuda loads, so that no binary
  # names two copies of one soname (CMake could not order their RUNPATH folders; either could
  # load first). The headers stay the toolkit's (CUDA::toolkit), as nvcc's are.
  set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES "${MIXTRAIN_CUDART};CUDA::toolkit")
  list(REMOVE_ITEM TORCH_LIBRARIES "${CUDA_NVRTC_LIB}")
  list(APPEND TORCH_LIBRARIES "${MIXTRAIN_NVRTC}")
  message(STATUS "mixtrain: CUDA runtime and NVRTC: the wheel's, ${MIXTRAIN_CUDART}")
else()
  message(STATUS "mixtrain: no libcudart.so.13 and libnvrtc.so.13 in the wheel's nvidia packages "
                 "(looked in: '${MIXTRAIN_NVIDIA_LIB_DIRS}'): the CUDA toolkit's, as TorchConfig names them")
endif()
