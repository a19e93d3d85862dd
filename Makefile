# Two commands matter: `make demo` and `make test`. Both set up .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Nothing is byte-compiled at install (`--no-compile`): Python compiles a module the first time it is imported and
# keeps the .pyc, so only what runs is compiled, once. Compiling all of .venv's 24,000 modules took 58 s on two cores
# (.venv-vllm's 21,600: 36 s); the ~4,400 that the suite's main imports load compiled lazily in 11 s, and vLLM's
# server's ~5,200 in 14 s. PYTHONDONTWRITEBYTECODE, where a shell sets it, is not passed on: with it every process
# would compile every module it imports again.
INSTALL := pip install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: install vllm browser transformers-5.17 test-deps gpu-rehearsal gpu-smoke demo test test-fast lint docs lab bench notebooks-html screenshots clean

install: $(STAMP)

# Idempotent: re-runs only when a requirements file or pyproject.toml changed.
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first and alone: an unpinned torch (pulled by any later package) is a multi-GB CUDA build.
	$(BIN)/$(INSTALL) torch==2.13.0
	$(BIN)/$(INSTALL) -r requirements.txt
	# --no-deps: see requirements-nodeps.txt for why each one's declared dependencies are refused.
	$(BIN)/$(INSTALL) --no-deps -r requirements-nodeps.txt
	$(BIN)/$(INSTALL) --no-deps -e .
	touch $(STAMP)

# vLLM in its own environment (requirements-vllm.txt says why), idempotent like install.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): requirements-vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	if nvidia-smi > /dev/null 2>&1; then \
	  $(VLLM_VENV)/bin/$(INSTALL) vllm==0.33.0; \
	else \
	  $(VLLM_VENV)/bin/$(INSTALL) torch==2.13.0 && \
	  $(VLLM_VENV)/bin/$(INSTALL) -r requirements-vllm.txt && \
	  $(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec; \
	fi
	# tcmalloc, which vLLM's CPU backend asks for; without it the server only runs a little slower
	test -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || apt-get install -y -q libtcmalloc-minimal4 \
	  || echo "note: libtcmalloc-minimal4 not installed; vLLM runs without it"
	touch $(VLLM_STAMP)

# transformers 5.17, the GPU machine's release, beside the project's (PYTHONPATH, for the GPU rehearsal only):
# the calls that differ between releases are checked against it. huggingface_hub 1.x is the one 5.17 accepts.
TF517 := $(VENV)/transformers-5.17
transformers-5.17: $(TF517)/.installed

$(TF517)/.installed: $(STAMP)
	$(BIN)/$(INSTALL) --no-deps --upgrade --target $(TF517) transformers==5.17.0 huggingface_hub==1.33.0
	touch $@

# The GPU path rehearsed on this CPU (tests/test_gpu_rehearsal.py says what each check would have caught).
gpu-rehearsal: install vllm transformers-5.17
	$(BIN)/python -m pytest -q tests/test_gpu_rehearsal.py

# The wheels experiments/device_train.sh needs beyond the device image (experiments/device-wheels.txt says which),
# into experiments/wheels (git ignores it), to carry to the device beside the working tree.
device-wheels:
	$(PY) -m pip download --no-deps --only-binary=:all: -d experiments/wheels -r experiments/device-wheels.txt

# On a GPU machine (one H100 or H200, ~10 min): two GRPO steps of experiments/bfcl_qwen3_1.7b_gpu.toml with vLLM,
# printing step times, peak GPU memory and a LoRA sync check (experiments/gpu_smoke.py). MODEL: a local folder or
# a hub name already in the Hugging Face cache (nothing is downloaded). Without CUDA it refuses in one line.
MODEL ?= Qwen/Qwen3-1.7B
gpu-smoke: install vllm
	$(BIN)/python experiments/gpu_smoke.py --model "$(MODEL)"

# Debian's chromium and chromedriver for the app's browser test: the test itself installs nothing, and
# no browser is downloaded from a hub. Without root or the Debian mirror the browser test skips, loudly.
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver \
	  || apt-get install -y -q chromium chromium-driver \
	  || (apt-get update -q && apt-get install -y -q chromium chromium-driver) \
	  || echo "warning: could not install chromium + chromium-driver: the browser test will skip"

demo: install
	$(BIN)/python -u -m envace.demo

# Every environment the suite needs, built side by side: pip and apt mostly wait on disk and unpack, so on a clean
# clone here the three took 108 s at once against 180 s one after another (`make -j3` against plain `make`); on a
# later, slower machine 182 s with pip's own byte-compiling, 147 s with compileall after it, 98 s without either
# (one clean clone each).
test-deps:
	$(MAKE) -j 3 install browser vllm transformers-5.17

# The whole suite, slow default-model tests included, after the linter.
test: test-deps
	$(BIN)/ruff check envace workbench apps tests
	# vLLM's modules compiled at the lowest priority while the suite runs: a quarter of two cores sits idle in it
	# (servers booting, processes waiting on each other), and its first vLLM server comes ~10 minutes in
	nice -n 19 $(VLLM_VENV)/bin/python -m compileall -q -q $(VLLM_VENV)/lib > /dev/null 2>&1 &
	$(BIN)/python -m pytest -q tests

test-fast: install
	$(BIN)/python -m pytest -q -m "not heavy" tests

lint: install
	$(BIN)/ruff check envace workbench apps tests

# docs/commands.md from the parser, docs/layout.md from the source tree (tests/test_docs_generated.py checks both).
docs: install
	$(BIN)/python -m envace.cli.docs

# JupyterLab on the notebooks (they launch runs into runs/ and read them back).
lab: install
	$(BIN)/jupyter lab --notebook-dir=notebooks --ip=127.0.0.1

# The notebooks run on a store (ROOT, default runs/) and written as HTML under docs/notebooks/ for reading.
ROOT ?= runs
notebooks-html: install
	for nb in notebooks/*.ipynb; do $(BIN)/python -c "import sys; from workbench.notebook import export_html; \
	  print(export_html(sys.argv[1], '$(ROOT)', 'docs/notebooks/' + sys.argv[1].split('/')[-1][:-6] + '.html'))" $$nb \
	  || exit 1; done

# Every tab of the app on the newest `make demo` result, as docs/screenshots (README.md shows them).
screenshots: install browser
	$(BIN)/python -m apps.screenshots --root $(ROOT) --out docs/screenshots

bench: install
	$(BIN)/envace bench rollout

clean:
	rm -rf $(VENV) $(VLLM_VENV)
