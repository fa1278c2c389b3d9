# Quick start: `make train` and `make test`. Everything else is installed by scripts/setup.sh.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CONFIG ?= configs/qwen2_moe_tiny.yaml
RUN_DIR ?= runs/default
NPROC ?= 2

.PHONY: all setup configure build python test train bench format clean

all: build

setup:
	@bash scripts/setup.sh

# CMAKE_ARGS: more configure options, e.g. CMAKE_ARGS=-DMIXTRAIN_CUDA=OFF (docs/development.md).
CMAKE_ARGS ?=

$(BUILD_DIR)/CMakeCache.txt: | setup
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: setup $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The Python package `mixtrain` (docs/python.md), built by `build` into $(BUILD_DIR)/python:
# a .pth file in .venv's site-packages names that folder, so .venv's Python imports it.
# A build configured with -DMIXTRAIN_PYTHON_PACKAGE=OFF has none: said, and nothing installed.
python: build
	@if [ ! -f $(BUILD_DIR)/python/mixtrain/__init__.py ]; then \
	  echo "no Python package in $(BUILD_DIR) (configured with MIXTRAIN_PYTHON_PACKAGE=OFF)"; exit 0; fi; \
	site=$$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") && \
	  echo "$(abspath $(BUILD_DIR))/python" > "$$site/mixtrain.pth" && \
	  .venv/bin/python -c "import mixtrain, mixtrain.optim; print(f'mixtrain {mixtrain.__version__} (for torch {mixtrain.torch_version}): importable from .venv')"

# `build` compiles `mixtrain`, the Python package and the test executables (the bench
# programs: `make bench`). --no-tests=error: a test run that finds no tests fails.
test: python
	ctest --test-dir $(BUILD_DIR) --output-on-failure --no-tests=error -j $(JOBS)

# Only what training needs: the mixtrain binary.
train: configure
	cmake --build $(BUILD_DIR) --target mixtrain -j $(JOBS)
	$(BUILD_DIR)/mixtrain train --config $(CONFIG) --nproc $(NPROC) --run-dir $(RUN_DIR)

# Every benchmark program under bench/, one after the other (figures: bench/README.md).
bench: build
	cmake --build $(BUILD_DIR) --target benchmarks -j $(JOBS)
	@set -e; for b in $(BUILD_DIR)/bench_*; do echo "== $$b"; $$b; done

format:
	find src tests bench -name '*.cpp' -o -name '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
