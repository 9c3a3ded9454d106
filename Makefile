# Two entry points: `make conformance` (the main job) and `make test` (the full suite).
# Each sets up .venv/ by itself; the stamp makes the second run instant.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# HypoFuzz's environment beside .venv (see fuzz-env below); `make test` runs one check in it.
FUZZ_ENV   := .venvs/hypofuzz
FUZZ_STAMP := $(FUZZ_ENV)/.installed
FUZZ_ARGS  ?= tests/test_conformance.py
# The newest vLLM release's overlay (see newest-env below); `make test` runs its findings in it.
NEWEST_VLLM  := 0.34.0
NEWEST_STAMP := .venvs/vllm-$(NEWEST_VLLM)/.newest-env
# The install an engine author makes, without vLLM (see test-engine-author below).
AUTHOR_ENV   := .venvs/engine-author
AUTHOR_STAMP := $(AUTHOR_ENV)/.installed
# Real simulators, each in its own environment from the package index (see certify below).
SIM_NANO  := .venvs/sim-nano-vllm
SIM_VIDUR := .venvs/sim-vidur

.PHONY: install compile test test-fast test-engine-author certify conformance fuzz soak coverage mutants record bench fuzz-env newest-env dashboard bench-fuzzers upgrade-check gpu-check clean distclean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --disable-pip-version-check -c constraints.txt -e '.[vllm,compiled]'
	touch $(STAMP)

# The compiled reference (harness/formats/compiled.py): reference/ built by mypyc into
# build/reference-compiled/ (about 40 s on 2 cores), kept while reference/ is unchanged.
# A process with HARNESS_REFERENCE=compiled runs it; fuzz, bench and upgrade-check below do.
compile: $(STAMP)
	$(PY) -m harness.jobs.compile_reference

# pytest-xdist: one worker per core (at most 8: each imports vLLM, ~2 GB); loadgroup keeps
# a module's tests that share an expensive fixture (marked xdist_group) on one worker.
TEST_WORKERS ?= auto

test: $(STAMP) $(FUZZ_STAMP) $(NEWEST_STAMP) compile
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 8 --dist loadgroup

# The developer's inner loop (about a minute on 2 cores): unit tests, the bundled streams on
# both engines, the replay tier and 30 streams per property; no self-tests, nothing slow.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 8 --dist worksteal \
		-m "not selftest and not slow" --hypothesis-profile fast

# The install an engine author makes (pip install -e ., no vLLM, no torch) in its own
# environment, and the tests such an author relies on run in it (20 s and 40 s on 2 cores):
# the plug-in interface, the line protocol, replay of the recorded traces, check, profile,
# the CLI's bad input and its one line when vLLM is missing, the engine-interface doc's examples.
$(AUTHOR_STAMP): pyproject.toml constraints.txt
	test -x $(AUTHOR_ENV)/bin/python || $(PYTHON) -m venv $(AUTHOR_ENV)
	$(AUTHOR_ENV)/bin/python -m pip install -qq --disable-pip-version-check -c constraints.txt -e .
	touch $(AUTHOR_STAMP)

AUTHOR_TESTS := tests/test_engine_author_install.py tests/test_plugin.py tests/test_line_protocol.py \
	tests/test_golden.py tests/test_engine_profile.py tests/test_cli_bad_input.py tests/test_docs_examples.py \
	tests/test_simulators.py tests/test_designs.py

test-engine-author: $(AUTHOR_STAMP)
	$(AUTHOR_ENV)/bin/python -m pytest -q -p no:cacheprovider -m "not slow" $(AUTHOR_TESTS)

conformance: $(STAMP)
	$(PY) -m harness conformance

fuzz: compile
	HARNESS_REFERENCE=compiled $(PY) -m harness fuzz --examples 2000

# Nightly: campaigns from seeds nobody has run.  Each property's campaign draws a fresh seed
# and prints it first (CI's campaigns keep their fixed seeds); a divergence's shrunk stream is
# kept as counterexamples/soak-<property>.json.  About 15 minutes on 2 cores as set here.
SOAK_EXAMPLES ?= 5000
SOAK_PROPERTIES ?= whole_space hybrid_groups window_hits draft_windows priority_victims priority_victim_windows \
	priority_victim_drafts connector_sends connector_idles async_scheduling pipeline_parallel \
	spec_decode
soak: $(STAMP)
	@status=0; for p in $(SOAK_PROPERTIES); do \
	  $(PY) -m harness fuzz --property $$p --examples $(SOAK_EXAMPLES) \
	    || { status=1; cp counterexamples/fuzz.json counterexamples/soak-$$p.json 2>/dev/null; }; \
	done; exit $$status

# What a 1,000-stream campaign executes of vLLM's v1/core, per file.
coverage: $(STAMP)
	$(PY) -m harness coverage --examples 1000

mutants: $(STAMP)
	$(PY) -m harness mutants

record: $(STAMP)
	$(PY) -m harness record fixtures/streams -o fixtures/traces/vllm-0.11.0/

# The plot needs matplotlib (extra [bench]); the tests do not.
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -qq --disable-pip-version-check -c constraints.txt -e '.[vllm,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) compile
	HARNESS_REFERENCE=compiled $(PY) -m harness bench

# HypoFuzz, hypothesis's coverage-guided fuzzer with a live dashboard, for fuzzing for hours
# (docs/fuzzing.md).  Its last release reads a hypothesis internal that 6.158 removed, so it
# lives beside .venv, in .venvs/hypofuzz, with the older hypothesis of constraints-hypofuzz.txt
# and everything else as pinned for .venv; the suite's own hypothesis is untouched.
$(FUZZ_STAMP): $(STAMP) constraints-hypofuzz.txt
	mkdir -p $(FUZZ_ENV)
	grep -v '^hypothesis==' constraints.txt > $(FUZZ_ENV)/constraints.txt
	$(PY) -m pip install -qq --disable-pip-version-check --upgrade --target $(FUZZ_ENV) \
		-c $(FUZZ_ENV)/constraints.txt -c constraints-hypofuzz.txt hypofuzz 'hypothesis[cli,watchdog]'
	touch $(FUZZ_STAMP)

fuzz-env: $(FUZZ_STAMP)

# The newest release's side environment (harness/jobs/side_env.py, about a minute): the short
# reproductions of docs/findings/newest/ run in it (tests/test_findings.py).
$(NEWEST_STAMP): $(STAMP)
	$(PY) -m harness.jobs.side_env $(NEWEST_VLLM) >/dev/null
	touch $(NEWEST_STAMP)

newest-env: $(NEWEST_STAMP)

# Every conformance property (or FUZZ_ARGS="tests/test_conformance.py -k window_hits"), on every
# core, until stopped; dashboard at http://localhost:9999.  Failures land in .hypothesis/, where
# `pytest -k <property>` replays them and writes counterexamples/<test>.json.
dashboard: $(FUZZ_STAMP)
	PYTHONPATH=$(FUZZ_ENV) $(PY) -m harness.jobs.hypofuzz_run -- $(FUZZ_ARGS)

# HypoFuzz against plain and targeted hypothesis on ten rarely decided rules, two laps each
# (about 30 minutes on 2 cores).
bench-fuzzers: $(FUZZ_STAMP)
	$(PY) -m harness race --laps 2 --report docs/performance.md

# Captures of the bundled streams by a model that samples, turned into scripted streams and
# replayed (docs/gpu-check.md); without a GPU, the CPU half.
gpu-check: $(STAMP)
	$(PY) -m harness gpu-check

# make upgrade-check VLLM=0.19.0: that release against 0.11.0's rules (docs/upgrades/);
# VLLM=latest: the newest release on the package index (one line says which and why);
# FROM=0.13.0: against that release instead (report docs/upgrades/0.13.0-to-0.19.0.md);
# ARGS: more options of `python -m harness upgrade-check`, e.g. ARGS="--examples 500"
# or ARGS="--fail-on unexplained" (a difference fails only when a cause is not named).
FROM ?= 0.11.0
ARGS ?=
upgrade-check: $(STAMP)
	@test -n "$(VLLM)" || { echo "error: VLLM: say which release, e.g. make upgrade-check VLLM=0.19.0 or VLLM=latest" >&2; exit 2; }
	$(PY) -m harness.jobs.compile_reference
	HARNESS_REFERENCE=compiled $(PY) -m harness upgrade-check $(VLLM) --from $(FROM) $(ARGS)

# Real simulators held to vLLM 0.11.0 (docs/simulators.md): nano-vllm and Vidur's two
# schedulers, as they are and with the one patch that gets each past its crash, then the
# project's example engine, the reference over the line protocol and vLLM itself as
# controls.  Each simulator runs in its own environment (the harness without vLLM, and the
# simulator without its GPU dependencies); certificates (report.md, report.json,
# badge.svg, counterexamples) go to $(CERT_DIR)/<engine>/, and the compliance table to stdout.
CERT_DIR ?= docs/simulators
CERT_STREAMS ?= 50
CERTIFY = -m harness certify --streams $(CERT_STREAMS)

$(SIM_NANO)/.installed: pyproject.toml constraints.txt examples/simulators/nano_vllm_requirements.txt
	test -x $(SIM_NANO)/bin/python || $(PYTHON) -m venv $(SIM_NANO)
	$(SIM_NANO)/bin/python -m pip install -qq --disable-pip-version-check -c constraints.txt -e .
	$(SIM_NANO)/bin/python -m pip install -qq --disable-pip-version-check --no-deps \
		-r examples/simulators/nano_vllm_requirements.txt
	touch $@

$(SIM_VIDUR)/.installed: pyproject.toml constraints.txt examples/simulators/vidur_requirements.txt
	test -x $(SIM_VIDUR)/bin/python || $(PYTHON) -m venv $(SIM_VIDUR)
	$(SIM_VIDUR)/bin/python -m pip install -qq --disable-pip-version-check -c constraints.txt -e .
	$(SIM_VIDUR)/bin/python -m pip install -qq --disable-pip-version-check --no-deps \
		-r examples/simulators/vidur_requirements.txt
	touch $@

certify: $(STAMP) $(SIM_NANO)/.installed $(SIM_VIDUR)/.installed
	-$(SIM_NANO)/bin/python $(CERTIFY) examples.simulators.nano_vllm:NanoVllm -o $(CERT_DIR)/nano-vllm
	-$(SIM_NANO)/bin/python $(CERTIFY) examples.simulators.nano_vllm:NanoVllmPatched -o $(CERT_DIR)/nano-vllm-patched
	-$(SIM_VIDUR)/bin/python $(CERTIFY) --level preemptions examples.simulators.vidur:VidurVllm -o $(CERT_DIR)/vidur-vllm
	-$(SIM_VIDUR)/bin/python $(CERTIFY) --level preemptions examples.simulators.vidur:VidurVllmPatched -o $(CERT_DIR)/vidur-vllm-patched
	-$(SIM_VIDUR)/bin/python $(CERTIFY) --level preemptions examples.simulators.vidur:VidurSarathi -o $(CERT_DIR)/vidur-sarathi
	-$(SIM_VIDUR)/bin/python $(CERTIFY) --level preemptions examples.simulators.vidur:VidurSarathiPatched -o $(CERT_DIR)/vidur-sarathi-patched
	-$(PY) $(CERTIFY) examples.tiny_sim:TinySim -o $(CERT_DIR)/tiny-sim
	-$(PY) $(CERTIFY) "cmd:$(PY) -m harness serve reference" -o $(CERT_DIR)/reference
	-$(PY) $(CERTIFY) vllm -o $(CERT_DIR)/vllm
	$(PY) -m harness compliance $(CERT_DIR)/*/report.json

# Caches and outputs; the ~10 GB environment stays (see distclean).
clean:
	rm -rf .pytest_cache .hypothesis counterexamples build *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# Everything clean removes, and the environment.
distclean: clean
	rm -rf $(VENV) $(FUZZ_ENV) $(AUTHOR_ENV) $(SIM_NANO) $(SIM_VIDUR)
