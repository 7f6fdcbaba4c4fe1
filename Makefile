# Two commands: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): setup.py constraints.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch first, from the pinned version, so nothing else can choose a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@$(PY) -c "import torch, sys; v = torch.__version__; print('torch', v); sys.exit(0 if v.startswith('2.13.0') else 'wrong torch: ' + v)"
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m jigsaw_verl.cli demo

test: $(STAMP)
	$(VENV)/bin/ruff check jigsaw_verl tests scripts patches
	$(VENV)/bin/ruff format --check jigsaw_verl tests scripts patches
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
