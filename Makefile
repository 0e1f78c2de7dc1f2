# Two commands do all set-up on a fresh machine:
#   make app    the viewer on the bundled H200 traces (traces/), in your browser
#   make test   every CPU test (GPU tests skip without a GPU), installing what they need
# Python >= 3.11; everything goes into .venv here.

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_APP := $(VENV)/.installed-app
STAMP_TEST := $(VENV)/.installed-test

.PHONY: app test view clean-venv

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"

$(STAMP_APP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[app]"
	touch $@

# torch 2.13.0 first: on the CI image pip takes it from a local CPU build; the extras' ranges
# are then already satisfied (a plain range would pull a multi-GB CUDA build).
$(STAMP_TEST): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[app,dev,dsl,torch]"
	$(BIN)/python -m pip install -q --no-deps "flash-attn-4==4.0.0b36" "quack-kernels==0.6.5" "einops>=0.8,<0.9" "triton==3.9.0"
	touch $@

app: $(STAMP_APP)
	$(BIN)/fa4trace view

view: app

test: $(STAMP_TEST)
	bash .ci/system-deps.sh
	$(BIN)/python -m pytest -q

clean-venv:
	rm -rf $(VENV)
