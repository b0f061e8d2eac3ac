# ndmesh: the two commands of the quick start.
#   make run   installs what is missing, builds, and runs the main job on 8 local ranks
#   make test  installs what is missing, builds, and runs every test
# Other targets: deps, build, bench, format, clean, and the hardening builds (README
# "Hardening"): sanitize (ASan+UBSan, whole ctest suite), tsan (ThreadSanitizer, the
# communicator's tests), fuzz (libFuzzer targets in fuzz/, FUZZ_SECONDS each).

BUILD_DIR ?= build
JOBS      ?= 2
BUILD_TYPE ?= Release
CMAKE_FLAGS ?=
ifneq ($(CI),)
CMAKE_FLAGS += -DNDMESH_WERROR=ON
endif

# Debian packages the build and the tests need; installed only when missing. pybind11-dev,
# python3-dev and python3-pytest build and test the Python module (python/), which the
# build skips with a warning when they are absent. libgloo-dev is the Gloo backend (launches
# without mpirun); python3-torch (PyTorch 1.13, 77 MB to download, about 1.5 min to install
# here) serves a real c10d TCPStore in the agent-store tests (tests/store), which skip
# without it, and runs the PyTorch interop's tests (ndmesh.torch, under torchrun).
# libhwloc-plugins (which Open MPI's hwloc loads where present; apt installs it as a
# recommendation) is named so that sanitize.train_hwloc always meets hwloc's GPU plugins.
#
# The Python package's build backend, scikit-build-core, is not packaged by Debian 12: deps
# downloads it (and mypy, for the type stubs' test) from PyPI into the wheelhouse WHEELHOUSE,
# once; `pip install --no-index --find-links $(WHEELHOUSE) .` then builds offline, and so
# does the test (tests/python/pip_install.sh, skipped when the wheelhouse is empty).
# The same wheelhouse holds the nvidia-cudnn-frontend wheel (downloaded without its
# dependencies): CMake extracts the cuDNN frontend's headers from it into the build folder for
# cuDNN attention (NDMESH_CUDNN, docs/gpu.md); without it (PyPI unreachable) cuDNN attention
# is not built and the configure summary says so.
WHEELHOUSE ?= .wheels
PY_WHEELS := scikit-build-core mypy
DEB_PACKAGES := build-essential cmake pkg-config openmpi-bin libopenmpi-dev libopenblas-dev \
  libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libfmt-dev \
  librsvg2-bin jq zlib1g-dev pybind11-dev python3-dev python3-pytest clang libclang-rt-dev \
  libgloo-dev python3-torch python3-venv python3-pip libhwloc-plugins

SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: all deps build run test test-fast bench format clean sanitize sanitize-build sanitize-test tsan fuzz

all: build

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing missing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@ls $(WHEELHOUSE)/scikit_build_core-*.whl $(WHEELHOUSE)/mypy-*.whl >/dev/null 2>&1 || \
	  { echo "downloading into $(WHEELHOUSE) from PyPI:" $(PY_WHEELS); \
	    /usr/bin/python3 -m pip download -q --disable-pip-version-check --dest $(WHEELHOUSE) $(PY_WHEELS) || \
	    echo "warning: PyPI unreachable; the pip install test will be skipped"; }
	@ls $(WHEELHOUSE)/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1 || \
	  { echo "downloading into $(WHEELHOUSE) from PyPI: nvidia-cudnn-frontend (the cuDNN frontend's headers)"; \
	    /usr/bin/python3 -m pip download -q --disable-pip-version-check --no-deps --dest $(WHEELHOUSE) \
	      nvidia-cudnn-frontend || echo "warning: PyPI unreachable; cuDNN attention will not be built"; }

$(BUILD_DIR)/Makefile:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/Makefile
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	@bash scripts/run_main.sh $(BUILD_DIR)

# Then the tests that skipped, with their reasons; a skip for want of a package that deps
# installs (or of root, running as root) fails it (scripts/test_skips.py).
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) --timeout 600 --output-junit ctest-junit.xml; \
	  rc=$$?; python3 $(CURDIR)/scripts/test_skips.py ctest-junit.xml $(CURDIR)/Makefile || rc=1; exit $$rc

# The fast tier: unit tests and a few end-to-end runs (ctest label "fast"), about a minute on
# 2 cores once built; make test runs everything.
test-fast: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) --timeout 300 -L fast

bench: build
	@bash scripts/run_bench.sh $(BUILD_DIR)

format:
	find include src tools tests bench examples python -name '*.hpp' -o -name '*.cpp' | xargs clang-format -i

# ---------------------------------------------------------------------- hardening
# Each has its own build folder, so none disturbs $(BUILD_DIR).
SAN_DIR   ?= build-sanitize
TSAN_DIR  ?= build-tsan
FUZZ_DIR  ?= build-fuzz
FUZZ_SECONDS ?= 60
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
# Leaks: only Open MPI's own allocations still held at exit are suppressed (lsan.supp).
# no_dlclose.so keeps Open MPI's plugins loaded so their leaks can be named (see the file).
# intercept_tls_get_addr=0: GCC 12's runtime reads a dynamic TLS block that starts 16 bytes
# into a page as glibc 2.19's layout and records a bogus range that the leak check then
# faults on (tests/sanitize/dtls_probe.c); which runs meet it depends on the modules loaded
# (hwloc's GPU plugins did). Nothing is lost: LeakSanitizer still scans those blocks, as heap
# chunks the dynamic loader allocated (use_ld_allocations), and ASan never needed the hook.
SAN_ENV := LD_PRELOAD=$(CURDIR)/$(SAN_DIR)/no_dlclose.so \
  ASAN_OPTIONS=detect_leaks=1:verify_asan_link_order=0:strict_string_checks=1:intercept_tls_get_addr=0 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitize/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
TSAN_ENV := TSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitize/tsan.supp:ignore_noninstrumented_modules=1:halt_on_error=1:exitcode=66:report_signal_unsafe=0

# ASan + UBSan over the ctest suite (unit, CLI and multi-process tests), but SAN_SKIP.
# The Python module and the install consumer are not built: neither python3 nor the consumer
# is instrumented (both are thin layers over what the suite tests directly).
# SAN_SKIP (a ctest regex; `make sanitize SAN_SKIP='^multinode\.'` runs the rest too):
# - multinode.*: their remote ranks start through an rsh agent with a clean environment (as
#   ssh would), without the sanitizers' options and preload; they run the mpi.* tests' code.
# - what the sanitizers cannot see into: the work of python.tensorboard_reader (tensorboard's
#   reader of our event files) and cli.gpu_check_compare (the GPU check's comparison script)
#   is Python's; the writer and the runs they read are in cli.train_watch and cli.train. The
#   store.*_agent tests: their store server is PyTorch's TCPStore (Python), their ranks run
#   the code of the store.*_own tests, which run here.
# - what repeats code that other tests run under the sanitizers: cli.train_bf16 (300 steps,
#   twice, of the bf16 path of mpi.train_bf16 and the nn.* tests), mpi.plan_runs (2-step runs
#   of the layouts mpi.train_* run), cli.published_runs (the planner's arithmetic over the
#   published rows, which plan.* and cli.plan run), mpi.train_dp, mpi.train_tp, mpi.train_pp
#   and mpi.train_cp (their layouts, every pipeline schedule and both cp layouts among them,
#   are composed in mpi.train_4d, their parts in the parallel.* tests, the timeouts in
#   mpi.timeout_*; their resumes in mpi.train_checkpoint); mpi.zero3_memory and
#   mpi.llama_memory (the planner's memory figure against the trainer's tally: their code runs
#   in mpi.train_zero3 and mpi.train_llama, and under the sanitizers' slowdown the gradient
#   work space's sampled peak depends on how far the reductions have run: one unit measured
#   where the plan counts two, 1.10 on dp 4 in one run). parallel.Zero3BuildMemory.PeakIsThe-
#   ShardPlusOneTensor: it measures the resident set, which under AddressSanitizer's allocator
#   (shadow memory, quarantine, redzones) is not the program's (102 MiB grown where the build
#   itself holds 60; the same build runs here in its other case, KeptBlocksHold...).
# LeakSanitizer checks every process at exit, but in the multi-rank runs of tests/mpi/train_lib.sh
# only a test's first one (tests/sanitize/leak_check_once.sh says why).
# The build keeps line tables only (-g1): reports still name file and line, and the heaviest
# sources compile in about two thirds of -g's time. The tests' own sources compile at -O0
# (NDMESH_TEST_OPT, tests/CMakeLists.txt): under half of -O1's time there; the libraries they
# test stay at -O1.
SAN_SKIP ?= ^(multinode\.|store\..*_agent$$|python\.tensorboard_reader$$|cli\.gpu_check_compare$$|cli\.train_bf16$$|mpi\.plan_runs$$|cli\.published_runs$$|mpi\.train_(dp|tp|pp|cp)$$|mpi\.(zero3|llama)_memory$$|parallel\.Zero3BuildMemory\.PeakIsTheShardPlusOneTensor$$)
# sanitize = sanitize-build, then sanitize-test (.ci/run runs the build beside make test).
sanitize: sanitize-build
	$(MAKE) --no-print-directory sanitize-test

sanitize-build: deps
	cmake -S . -B $(SAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DNDMESH_BUILD_BENCH=OFF \
	  -DNDMESH_PYTHON=OFF -DNDMESH_INSTALL_TEST=OFF -DNDMESH_CUDA=OFF \
	  -DCMAKE_CXX_FLAGS="-O1 $(SAN_FLAGS)" -DCMAKE_C_FLAGS="-O1 $(SAN_FLAGS)" \
	  -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1 -DNDMESH_TEST_OPT=-O0 \
	  -DCMAKE_EXE_LINKER_FLAGS="$(SAN_FLAGS)" $(CMAKE_FLAGS)
	cmake --build $(SAN_DIR) -j$(JOBS)
	cc -shared -fPIC -O2 -o $(SAN_DIR)/no_dlclose.so tests/sanitize/no_dlclose.c

sanitize-test:
	@test -f $(SAN_DIR)/no_dlclose.so || { echo "make sanitize-test: no sanitizer build in $(SAN_DIR); run make sanitize-build (or make sanitize) first"; exit 2; }
	cd $(SAN_DIR) && $(SAN_ENV) ctest --output-on-failure -j$(JOBS) --timeout 1200 -E '$(SAN_SKIP)'

# ThreadSanitizer over the tests of the communicator's watchdog and asynchronous work.
# Also the threads of training: the data-parallel progress thread (mpi.train_dp,
# mpi.progress_thread_gap) and the ring attention's polling (mpi.ring_attention_*,
# mpi.train_cp), and recompute re-running the ring and the tp collectives inside the backward
# (mpi.train_recompute); and the in-process backend, whose ranks are threads of one process
# (comm.*, and the component tests parallel.*GradReducer*, *GradSync*, *Executor*, *RingAttention*).
TSAN_TESTS := ^(comm\.|parallel\..*(GradReducer|GradSync|Executor|RingAttention)|mpi\.collectives|mpi\.timeout|mpi\.allreduce_np[23]|mpi\.ring_attention|mpi\.progress_thread|mpi\.host_mpi|mpi\.train_dp|mpi\.train_cp|mpi\.train_pp|mpi\.train_tp|mpi\.tp_grad|mpi\.train_recompute)
TSAN_TARGETS := comm_test_communicator_single comm_test_inproc comm_test_inproc_collectives comm_test_inproc_allreduce \
  comm_test_tag_discipline parallel_test_grad_reducer parallel_test_grad_sync parallel_test_executor \
  parallel_test_inproc_ring_attention parallel_test_ring_attention_tags mpi_test_comm_collectives mpi_timeout_probe \
  mpi_test_allreduce \
  mpi_test_ring_attention mpi_test_tp_grad mpi_progress_probe ndmesh
tsan: deps
	cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DNDMESH_BUILD_BENCH=OFF \
	  -DNDMESH_PYTHON=OFF -DNDMESH_INSTALL_TEST=OFF -DNDMESH_CUDA=OFF \
	  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=thread" -DCMAKE_C_FLAGS="-O1 -fsanitize=thread" \
	  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" $(CMAKE_FLAGS)
	cmake --build $(TSAN_DIR) -j$(JOBS) --target $(TSAN_TARGETS)
	cd $(TSAN_DIR) && $(TSAN_ENV) ctest --output-on-failure -j$(JOBS) --timeout 600 -R '$(TSAN_TESTS)'

# libFuzzer targets (fuzz/), built with Debian's clang, each run FUZZ_SECONDS seconds on
# its seed corpus (fuzz/corpus/<target>); new inputs go to $(FUZZ_DIR)/corpus/<target>.
fuzz: deps
	cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=Debug -DNDMESH_BUILD_BENCH=OFF -DNDMESH_BUILD_FUZZ=ON -DNDMESH_CUDA=OFF \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
	  -DCMAKE_C_FLAGS="-O1 -fsanitize=fuzzer-no-link,address,undefined"
	cmake --build $(FUZZ_DIR) -j$(JOBS) --target fuzz_all
	@bash fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD_DIR)
