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
	$(BIN)/python -m pip install -q -e ".[viewer]"
	touch $@

# torch 2.13.0 first: on the CI image pip takes it from a local CPU build, and the extras'
# ranges (torch, and flash-attn-4 / quack-kernels, which ask for any torch) are then already
# satisfied: a plain range would pull a multi-GB CUDA build. Then one resolve of every extra,
# with dependencies, so `pip check` is clean and nothing overrides what torch pins (a CUDA
# torch's own triton satisfies the `fa4` extra's range; the CPU build brings none, so pip adds
# one). `make test` runs `pip check` first, and tests/test_install.py too.
# Bytecode: pip compiles one file at a time; compileall does it on the cores pip leaves idle
# (torch's while the extras resolve and unpack, on one core) and on every core after the
# installs. It must be written at install: where PYTHONDONTWRITEBYTECODE is set (CI images often
# set it) every process would otherwise compile what it imports. Left out (NOPYC): the packages'
# own test suites (tests/, test/, torch's testing/_internal) and what no test imports (sympy and
# networkx, which only torch's compiler loads; Ray's libraries beside its core) - a third of the
# files; a module of them that is imported after all is compiled as it loads. compileall exits 1
# on the few files this Python cannot compile (torch ships helpers for Python 3.12 only): harmless.
NOPYC := '/(tests?|testing/_internal|sympy|networkx|ray/(rllib|serve|tune|train|data|air|llm|workflow))/'
$(STAMP_TEST): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --no-compile "torch==2.13.0"
	$(BIN)/python -m compileall -q -x $(NOPYC) $(VENV)/lib/python3*/site-packages/torch > /dev/null 2>&1 & \
	  $(BIN)/python -m pip install -q --no-compile -e ".[viewer,test,dsl,torch,fa4,ray]"; rc=$$?; wait; exit $$rc
	$(BIN)/python -m compileall -q -j 0 -x $(NOPYC) $(VENV)/lib > /dev/null 2>&1 || true
	touch $@

app: $(STAMP_APP)
	$(BIN)/fa4trace view

view: app

# Three test processes on two cores: some tests mostly wait (a sweep worker's timeout, a browser
# page), and a third process keeps a core busy meanwhile (docs/make-test-time.md). This
# checkout's own sources get their bytecode first (on every core; __pycache__ is ignored by
# git): the tests start a few hundred Python processes, each of which would otherwise compile
# the modules of fa4trace it imports.
test: $(STAMP_TEST)
	$(BIN)/python -m pip check
	bash .ci/system-deps.sh
	$(BIN)/python -m compileall -q -j 0 fa4trace app kernels benchmarks tests/tools > /dev/null
	$(BIN)/python -m pytest -q -n 3 --dist loadfile

clean-venv:
	rm -rf $(VENV)
