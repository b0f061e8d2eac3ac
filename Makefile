# ndmesh: the two commands of the quick start.
#   make run   installs what is missing, builds, and runs the main job on 8 local ranks
#   make test  installs what is missing, builds, and runs every test
# Other targets: deps, build, bench, format, clean.

BUILD_DIR ?= build
JOBS      ?= 2
BUILD_TYPE ?= Release
CMAKE_FLAGS ?=
ifneq ($(CI),)
CMAKE_FLAGS += -DNDMESH_WERROR=ON
endif

# Debian packages the build and the tests need; installed only when missing. pybind11-dev,
# python3-dev and python3-pytest build and test the Python module (python/), which the
# build skips with a warning when they are absent.
DEB_PACKAGES := build-essential cmake pkg-config openmpi-bin libopenmpi-dev libopenblas-dev \
  libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libfmt-dev \
  librsvg2-bin jq zlib1g-dev pybind11-dev python3-dev python3-pytest

SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: all deps build run test bench format clean

all: build

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing missing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(BUILD_DIR)/Makefile:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/Makefile
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	@bash scripts/run_main.sh $(BUILD_DIR)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) --timeout 600

bench: build
	@bash scripts/run_bench.sh $(BUILD_DIR)

format:
	find include src tools tests bench examples python -name '*.hpp' -o -name '*.cpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
