# Two commands on a fresh machine: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PIP    := $(PY) -m pip install --disable-pip-version-check -q

.PHONY: install demo test typecheck test-long lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first: this exact pin takes the CPU wheel; a looser spec pulls GBs of CUDA wheels.
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fedfraud demo --out out/demo

# Two pytest-xdist workers, one test module each at a time (--dist loadfile keeps a module's fixtures in one
# process): most integration tests wait on Ray, Serve, Flower or a broker to start, and the other worker runs
# meanwhile. `-n 0` (or -p no:xdist) runs the suite in one process.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(typecheck)
	$(PY) -m pytest -q -m "not long" -n 2 --dist loadfile --durations=15 tests

# mypy on the typed public API ([tool.mypy] in pyproject.toml lists the modules). mypy cannot follow setup.py's
# folder map through the editable install's import hook, so build/mypy-path/fedfraud/ links training/, serving/
# feature_store/, config/ and core/ under the names they install as.
define typecheck
mkdir -p build/mypy-path/fedfraud
for d in config training serving feature_store core; do ln -sfn ../../../$$d build/mypy-path/fedfraud/$$d; done
$(PY) -m mypy
endef

typecheck: $(STAMP)
	$(typecheck)

# The minutes-long integration tests (~15 min: federated trainings across SuperLink/SuperNode processes, one
# malicious bank under every aggregation rule, SecAgg+, a two-node Ray cluster). CI runs them after `make test`.
test-long: $(STAMP)
	$(PY) -m pytest -q -m long tests

bench: $(STAMP)
	$(VENV)/bin/fedfraud bench features

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache build/mypy-path
