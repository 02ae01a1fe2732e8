# sdq — set-up, tests and the reproduce pipeline.
# Needs only python3, gcc and make: `setup` creates .venv and installs everything into it.

PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
PARAMS   ?= default
STAMP    := $(VENV)/.installed-sdq
# llama-cpp-python compiles llama.cpp from source; use every core for it.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: setup test reproduce docs lab lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard kernels_c/*.c kernels_c/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[lab,dev]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

test: setup
	$(PY) -m pytest -q

# Run every notebook with params/$(PARAMS).yaml into outputs/<notebook>/$(PARAMS)/, then docs/.
# ONLY=00_model_anatomy runs just that notebook.
reproduce: setup
	$(PY) -m sdq.lab.reproduce --params $(PARAMS) $(if $(ONLY),--only $(ONLY))
	$(MAKE) --no-print-directory docs PARAMS=$(PARAMS)

# Render docs/ from outputs/ (tables and charts are inserted, never typed).
docs: setup
	$(PY) -m sdq.lab.docs --params $(PARAMS)

lab: setup
	$(VENV)/bin/jupyter lab notebooks

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf build *.egg-info sdq/*.so .pytest_cache .ruff_cache outputs/*/smoke
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
