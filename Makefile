# Two commands for a newcomer: `make run` starts Warren, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install reference-rabbitmq browser faketime docker-engine run lint format test test-all test-fast test-cluster test-docker test-faults soak fuzz bench bench-delayed clean

install: $(STAMP)

$(STAMP): pyproject.toml amqp/_speedups.pyx log/_speedups.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The compat suite also runs against a real RabbitMQ. Debian's package is installed when we
# can (root); elsewhere the reference runs are skipped, except under CI=true where they fail.
reference-rabbitmq:
	@if ! command -v rabbitmq-server >/dev/null 2>&1 && [ ! -x /usr/sbin/rabbitmq-server ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null; \
		else \
			echo "note: rabbitmq-server is not installed; compat tests will not run against a reference RabbitMQ"; \
		fi; \
	fi

# The web console is tested in Debian's headless chromium through chromium-driver, installed the
# same way (as root); elsewhere the browser tests are skipped, except under CI=true.
browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
		else \
			echo "note: chromium and chromium-driver are not installed; the web console's browser tests will not run"; \
		fi; \
	fi

# The fault tests jump a node's clock with libfaketime (Debian's faketime) and slow a node's
# disk with a preloaded library they build with the C compiler (gcc), installed the same way;
# elsewhere the clock-jump and slow-disk scenarios are skipped.
faketime:
	@if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || ! command -v cc >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime gcc libc6-dev >/dev/null; \
		else \
			echo "note: faketime or gcc is not installed; the fault tests' clock jumps or slow disks will not run"; \
		fi; \
	fi

# The Docker test runs a real engine: Debian's docker.io and docker-compose, and debootstrap
# for a base image built without a registry, installed as root and dockerd started when none
# answers (scripts/docker_engine.sh); elsewhere the Docker test is skipped, except under CI=true.
docker-engine:
	@scripts/docker_engine.sh

run: $(STAMP)
	$(BIN)/warren serve

# One style, checked before every test run (configured in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: $(STAMP) reference-rabbitmq browser faketime lint
	$(BIN)/pytest

# The whole suite, as CI runs it.
test-all: test test-cluster test-docker

test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow"

# docker/'s image and 3-node compose cluster on a real engine: a few minutes, more the first
# time (scripts/docker_base_image.sh builds the base), so `make test` leaves it out; CI runs both.
# The client compatibility suite again, each client on a node other than its queue's.
test-cluster: $(STAMP)
	WARREN_COMPAT_CLUSTER=1 $(BIN)/pytest compat_tests -k warren-cluster

test-docker: $(STAMP) docker-engine
	$(BIN)/pytest -m docker tests/test_docker_cluster.py

# Issue 12's fault tests, long: every nemesis with 10 s and 30 s faults for minutes each, and
# the results table (published, confirmed, consumed, lost, duplicated) at the end. `make test`
# runs a few seconds of each.
test-faults: $(STAMP) faketime
	$(BIN)/pytest -m faults tests/test_faults.py

# 100,000 queues and 255,000 priority levels under a 4,096-file limit: long, and gigabytes.
soak: $(STAMP)
	$(BIN)/pytest -m soak

# 1,000,000 mutated frames over real sockets to a running broker (`make test` sends 20,000):
# about a minute. WARREN_FUZZ_SEED=N replays a run; the seed is printed.
fuzz: $(STAMP)
	WARREN_FUZZ_FRAMES=1000000 $(BIN)/pytest -s tests/test_hostile_fuzz.py

bench: $(STAMP)
	$(BIN)/warren bench log

# RSS of a broker holding 1,000,000 messages delayed for an hour (the issue's budget: < 50 MB),
# and again after a restart that recovers them: a minute or two, and ~300 MB of disk.
bench-delayed: $(STAMP)
	$(BIN)/warren bench delayed --restart

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis test-artefacts
