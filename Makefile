# The two commands of README.md: `make run` (the CPU learning run, examples/local.yaml) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The default suite runs on this many pytest-xdist workers: most of its tests wait on sandboxes, sockets and child
# processes, so two workers keep a 2-core machine busy (10.6 minutes there with the learning gate, against 13
# without it on one worker). Tests sharing a costly session fixture stay on one worker (tests/conftest.py,
# --dist loadgroup).
PYTEST_WORKERS ?= 2
RUN_ARGS ?=

.PHONY: setup setup-docker run test test-slow test-learning lint dead-code protos bench

setup:
	@bash scripts/setup.sh

setup-docker:
	@T1_SETUP_DOCKER=1 bash scripts/setup.sh

run: setup
	$(BIN)/t1-coordinator --config examples/local.yaml $(RUN_ARGS)

test: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-slow: setup
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

# The learning run and its bar (docs/learning.md): in neither test nor test-slow until the lift holds.
test-learning: setup
	$(BIN)/python -m pytest -m learning $(PYTEST_ARGS)

lint: setup dead-code
	$(BIN)/ruff check t1 tests bench
	$(BIN)/mypy

# Dead code: names nothing uses (framework callbacks are listed, with reasons, in the whitelist).
# Two passes: what nothing uses, then what only the tests use (t1 and bench without tests).
dead-code: setup
	$(BIN)/vulture t1 tests bench .ci/vulture_whitelist.py --exclude t1/v1,tests/fixtures --min-confidence 60
	$(BIN)/vulture t1 bench .ci/vulture_whitelist.py .ci/vulture_t1_only.py --exclude t1/v1 --min-confidence 60

protos: setup
	$(BIN)/python -m t1.rpc.protogen
