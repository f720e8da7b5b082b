# The two commands a new user types: `make demo` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ORCH := $(CURDIR)/$(BIN)/orch
DEMO := examples/tinylm

.PHONY: setup system demo test test-fast bench clean

# The editable install in compat mode: the checkout's folder on sys.path, as a wheel's site-packages is, with no
# import hook loaded by every Python start (the default editable finder imports pathlib and importlib.util before
# orch does); a setuptools without that mode gets the default one.
$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,plot,mlflow,ui]' --config-settings editable_mode=compat \
	  || $(BIN)/pip install -q -e '.[test,plot,mlflow,ui]'
	touch $@

system:
	@./.ci/system-packages

setup: system $(BIN)/.installed

demo: setup
	cd $(DEMO) && $(ORCH) deploy --wait -m "demo: megabatch batching"
	cd $(DEMO) && $(ORCH) status
	cd $(DEMO) && (timeout -s INT 8 $(ORCH) logs --follow -n 5 || true)
	cd $(DEMO) && $(ORCH) restart --clean-checkpoints --yes -m "demo: restarted with clean checkpoints"
	cd $(DEMO) && sleep 3 && $(ORCH) status
	cd $(DEMO) && $(ORCH) checkpoints list
	cd $(DEMO) && $(ORCH) experiments list
	cd $(DEMO) && $(ORCH) stop

test: setup
	$(BIN)/python tests/groups.py

test-fast: setup
	$(BIN)/pytest -q -m "not testbed"

bench: setup
	$(BIN)/python benchmarks/bench_startup.py
	$(BIN)/python benchmarks/bench_deploy_local.py
	$(BIN)/python benchmarks/bench_batching.py --quick
	$(BIN)/python benchmarks/bench_metrics.py
	$(BIN)/python benchmarks/bench_workdir.py
	$(BIN)/python benchmarks/bench_mlflow.py
	$(BIN)/python benchmarks/bench_history.py
	$(BIN)/python benchmarks/bench_speed.py
	$(BIN)/python benchmarks/bench_ui.py

clean:
	rm -rf $(VENV) .pytest_cache
