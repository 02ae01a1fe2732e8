# sdq — set-up, tests and the reproduce pipeline.
# Needs only python3, gcc and make: `setup` creates .venv and installs everything into it.

PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
PARAMS   ?= default
STAMP    := $(VENV)/.installed-sdq
# llama-cpp-python compiles llama.cpp from source; use every core for it.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

# llama.cpp is built for this CPU's vector extensions, named explicitly, and without AMX:
# a -march=native build uses AMX tile instructions whenever the CPU reports them, and
# virtual machines that report AMX but do not enable it kill the process with SIGILL.
# The wheel is built once per flag set and kept in ~/.cache/sdq/wheels/.
LLAMA_CPP  := llama-cpp-python==0.3.36
CPU_FLAGS  := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
cpu_has     = $(filter $(1),$(CPU_FLAGS))
GGML_ARGS  := -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
	$(if $(call cpu_has,avx),-DGGML_AVX=ON) $(if $(call cpu_has,avx2),-DGGML_AVX2=ON) \
	$(if $(call cpu_has,fma),-DGGML_FMA=ON) $(if $(call cpu_has,f16c),-DGGML_F16C=ON) \
	$(if $(call cpu_has,bmi2),-DGGML_BMI2=ON) $(if $(call cpu_has,avx_vnni),-DGGML_AVX_VNNI=ON) \
	$(if $(call cpu_has,avx512f),-DGGML_AVX512=ON) \
	$(if $(call cpu_has,avx512vbmi),-DGGML_AVX512_VBMI=ON) \
	$(if $(call cpu_has,avx512_vnni),-DGGML_AVX512_VNNI=ON) \
	$(if $(call cpu_has,avx512_bf16),-DGGML_AVX512_BF16=ON)
WHEELS     := $(HOME)/.cache/sdq/wheels/$(shell echo '$(LLAMA_CPP) $(GGML_ARGS)' | md5sum | cut -c1-12)
# llama.cpp's tokenizer test files (models/ggml-vocab-*.gguf with their .inp/.out) taken from
# the same llama-cpp-python source package, for tests/test_tokenizer_vectors.py;
# $SDQ_LLAMA_CPP_SDIST names a local copy of that tarball.
VOCAB_TESTS := $(or $(SDQ_CACHE_DIR),$(HOME)/.cache/sdq)/vocab-tests/$(lastword $(subst ==, ,$(LLAMA_CPP)))

.PHONY: setup browser kernel-cache test mutation reproduce docs lab lint format clean

# fio, the reference `sdq probe --fio` (notebook 01) runs beside sdq: installed when missing.
setup: $(STAMP) browser $(VOCAB_TESTS)/.complete
	@command -v fio >/dev/null 2>&1 || { export DEBIAN_FRONTEND=noninteractive && { apt-get install -y -qq fio || { apt-get update -qq && apt-get install -y -qq fio; }; } >/dev/null 2>&1; } || echo "setup: fio could not be installed (apt-get install -y fio, as root): sdq probe runs without its fio column" >&2

# tests/test_site.py browses the HTML site in Debian's chromium, headless: installed here when
# missing (needs root). If it cannot be, that test fails saying so; nothing else needs it.
browser:
	@command -v chromium >/dev/null 2>&1 || { export DEBIAN_FRONTEND=noninteractive && \
	  { apt-get install -y -qq chromium || { apt-get update -qq && \
	    apt-get install -y -qq chromium; }; } >/dev/null 2>&1; } || \
	  echo "setup: chromium could not be installed (apt-get install -y chromium, as root)" >&2

$(STAMP): pyproject.toml $(wildcard kernels_c/*.c kernels_c/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || { rm -rf $(WHEELS).tmp && \
	  CMAKE_ARGS="$(strip $(GGML_ARGS))" $(PY) -m pip wheel --quiet --no-cache-dir --no-deps \
	    -w $(WHEELS).tmp $(LLAMA_CPP) && mv $(WHEELS).tmp $(WHEELS); }
	$(PY) -m pip install --quiet --no-deps --force-reinstall $(WHEELS)/llama_cpp_python-*.whl
	$(PY) -m pip install --quiet -e '.[reference,lab,dev]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

$(VOCAB_TESTS)/.complete: | $(STAMP)
	rm -rf $(VOCAB_TESTS).tmp && mkdir -p $(VOCAB_TESTS).tmp
	$(if $(SDQ_LLAMA_CPP_SDIST),cp '$(SDQ_LLAMA_CPP_SDIST)' $(VOCAB_TESTS).tmp/llama_cpp_python-local.tar.gz,\
	  $(PY) -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
	    -d $(VOCAB_TESTS).tmp $(LLAMA_CPP))
	tar -xzf $(VOCAB_TESTS).tmp/llama_cpp_python-*.tar.gz -C $(VOCAB_TESTS).tmp \
	  --strip-components=4 --wildcards '*/vendor/llama.cpp/models/ggml-vocab-*'
	rm -f $(VOCAB_TESTS).tmp/*.tar.gz && touch $(VOCAB_TESTS).tmp/.complete
	rm -rf $(VOCAB_TESTS) && mv $(VOCAB_TESTS).tmp $(VOCAB_TESTS)

# Numba caches compiled kernels per source file; drop them when the LLVM intrinsics they
# inline changed (sdq/kernels/jit.py).
kernel-cache: setup
	@$(PY) -c 'from sdq.kernels.jit import drop_stale_cache; drop_stale_cache()'

test: kernel-cache
	$(PY) -m pytest -q

# Mutation testing (not part of `make test`): mutmut mutates the pager cache, the cache policies,
# the memory plan, the sampler, the lab's verdict rule, the decode optimum, the device model,
# the cache simulator, the chat template and the expert reads ([tool.mutmut] in pyproject.toml names them and the
# fast tests each mutant runs against), one worker at low priority; tests/mutation/report.py
# writes the scores and every survivor with its classification (tests/mutation/equivalent.toml) to
# tests/mutation/REPORT.md. MUTANTS="sdq.run.sampler*" runs a subset. Numba's workqueue threading
# layer: mutmut forks a process per mutant, and Numba's OpenMP layer ends (SIGTERM) a forked child
# whose parent already ran a parallel kernel.
mutation: kernel-cache
	NUMBA_THREADING_LAYER=workqueue nice -n 10 $(VENV)/bin/mutmut run --max-children 1 $(MUTANTS)
	$(PY) tests/mutation/report.py

# Run every notebook with params/$(PARAMS).yaml into outputs/<notebook>/$(PARAMS)/, then docs/.
# ONLY=00_model_anatomy runs just that notebook.
reproduce: kernel-cache
	$(PY) -m sdq.lab.reproduce --params $(PARAMS) $(if $(ONLY),--only $(ONLY))
	$(MAKE) --no-print-directory docs PARAMS=$(PARAMS)

# Render docs/ from outputs/ (tables and charts are inserted, never typed), then the HTML site
# site/$(PARAMS)/ from the same pages and the executed notebooks. docs/ holds the committed
# default evidence: another parameter set (smoke) gets only its site.
docs: setup
	$(if $(filter default,$(PARAMS)),$(PY) -m sdq.lab.docs --params $(PARAMS))
	$(PY) -m sdq.lab.site --params $(PARAMS)

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
