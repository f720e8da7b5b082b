# The two commands a new user types: `make demo` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ORCH := $(CURDIR)/$(BIN)/orch
DEMO := examples/tinylm

.PHONY: setup system system-demo demo test test-fast docs bench clean

# The editable install in compat mode: the checkout's folder on sys.path, as a wheel's site-packages is, with no
# import hook loaded by every Python start (the default editable finder imports pathlib and importlib.util before
# orch does); a setuptools without that mode gets the default one. setuptools warns that compat mode is
# transitional in a 13-line banner on every install: that one warning is filtered.
QUIET_COMPAT := PYTHONWARNINGS="ignore:Compat editable installs"
$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(QUIET_COMPAT) $(BIN)/pip install -q -e '.[test,plot,mlflow,ui,docs,tensorboard,sweep]' --config-settings editable_mode=compat \
	  || $(BIN)/pip install -q -e '.[test,plot,mlflow,ui,docs,tensorboard,sweep]'
	touch $@

# the Debian packages: the demo's (it runs on this machine only), or the tests' too (LXC, sshd, nftables)
system-demo:
	@./.ci/system-packages demo

system:
	@./.ci/system-packages

setup: system $(BIN)/.installed

demo: system-demo $(BIN)/.installed
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

docs: setup
	$(BIN)/mkdocs build --strict

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
	rm -rf $(VENV) .pytest_cache site
