# Two commands do everything on a fresh machine (Python >= 3.11):
#   make html   build the website into _build/html (creates .venv and installs requirements first)
#   make test   run unit/property tests and re-execute every chapter notebook with nbval
#   make test-portable   the chapters again under another BLAS kernel, 2 BLAS threads and no AVX-512
#   make test-reseed SEED=n   every chapter under seed base n (ATTN_SEED): every check must still hold
# Also: make pdf (needs the TeX packages in the README), make study (Anki deck, one-page cheat sheet PDFs), make serve, make lab, make check-wheel, make execute NB=..., make clean.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
JOBS   ?= 2
STAMP   = $(VENV)/.installed

.PHONY: html pdf study cheatsheet-pdf test test-portable test-reseed check-wheel lint check-site lab serve execute execute-all summaries constraints clean

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (set PYTHON=...)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -c constraints.txt
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (attn_utils)" >/dev/null
	touch $(STAMP)

html: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@if [ -f _build/latex/attention-derived.pdf ]; then cp _build/latex/attention-derived.pdf _build/html/; \
	  else echo "Note: the site's PDF link works once 'make pdf' has run (it copies the PDF into _build/html)"; fi
	$(BIN)/python tools/build_study.py deck --out _build/html --base-url "$(STUDY_BASE_URL)"
	@if command -v xelatex >/dev/null; then $(BIN)/python tools/build_study.py pdf --out _build/html; \
	  else echo "Note: the site's cheat sheet PDF links need xelatex (the TeX packages in the README)"; fi
	@echo "Website: $(CURDIR)/_build/html/index.html"

pdf: $(STAMP)
	$(BIN)/jupyter-book build . --builder pdflatex -W -n --keep-going
	@! grep -n "Missing character" _build/latex/*.log || (echo "LaTeX dropped glyphs (see above)"; exit 1)
	@awk '/Overfull \\hbox/ { w = $$3; gsub(/[(pt]/, "", w); if (w + 0 > 5) { print; bad = 1 } } END { exit bad }' \
	  _build/latex/attention-derived.log || (echo "PDF: a line runs more than 5 pt into the margin (see above)"; exit 1)
	@if [ -d _build/html ]; then cp _build/latex/attention-derived.pdf _build/html/; fi
	@echo "PDF: $(CURDIR)/_build/latex/attention-derived.pdf"

# Study tools generated from the chapters (tools/build_study.py): the Anki deck _build/attention-derived.apkg
# and the cheat sheet on one page, _build/cheatsheet-a4.pdf and _build/cheatsheet-letter.pdf (xelatex);
# copied into _build/html when the site is built. Anki cards live outside the site, so their chapter links
# need the site's published address: make study STUDY_BASE_URL=https://…/ (without it they name the page).
STUDY_BASE_URL ?=
study: $(STAMP)
	$(BIN)/python tools/build_study.py deck pdf --base-url "$(STUDY_BASE_URL)"
	@if [ -d _build/html ]; then cp _build/attention-derived.apkg _build/cheatsheet-a4.pdf _build/cheatsheet-letter.pdf _build/html/; fi

cheatsheet-pdf: $(STAMP)
	$(BIN)/python tools/build_study.py pdf
	@if [ -d _build/html ]; then cp _build/cheatsheet-a4.pdf _build/cheatsheet-letter.pdf _build/html/; fi

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadscope --nbval --nbval-current-env

# Every chapter re-run and compared again on "another machine": OpenBLAS's Sandy Bridge kernel
# (runs on every x86-64 CPU), two BLAS threads per kernel, and numpy's AVX-512 loops switched off
# (those this CPU has). A printed line that depends on the machine fails here.
NPY_AVX512 = $$($(BIN)/python -c 'from numpy._core._multiarray_umath import __cpu_features__ as f, __cpu_dispatch__ as d; print(" ".join(k for k in d if f.get(k) and ("512" in k or k == "X86_V4")))' 2>/dev/null)
test-portable: $(STAMP)
	OPENBLAS_CORETYPE=Sandybridge OPENBLAS_NUM_THREADS=2 NPY_DISABLE_CPU_FEATURES="$(NPY_AVX512)" \
	  $(BIN)/python -m pytest -n $(JOBS) --dist loadscope --nbval --nbval-current-env chapters

# Every chapter executed in a fresh kernel under another seed base (ATTN_SEED=$(SEED)): new draws,
# new numbers, no output compared; fails when any check raises. Many bases: tools/reseed.py --bases 20
SEED ?= 1
test-reseed: $(STAMP)
	$(BIN)/python tools/reseed.py --seed $(SEED) --jobs $(JOBS)

# Lint and format check of the Python code (ruff, configured in pyproject.toml). To fix: ruff check --fix; ruff format
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The wheel a user would install from PyPI: built, installed (not editable) in a clean venv, every module imported.
check-wheel: $(STAMP)
	$(BIN)/python tools/check_wheel.py

# After make html: the site works offline (assets local, math rendered by headless Chromium), and its
# search, served over http from 127.0.0.1, finds every chapter by the phrasings the book lists for it.
check-site: $(STAMP)
	$(BIN)/python -m pytest -p no:xdist -q tests/pages/test_site.py tests/pages/test_study.py tests/pages/test_search.py

# JupyterLab with MyST rendering (requirements-lab.txt). Jupyter refuses to start as root unless told;
# root is normal in a container.
lab: $(STAMP)
	$(BIN)/python -m pip install --quiet -r requirements-lab.txt -c constraints.txt
	$(BIN)/jupyter lab chapters/ $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# The built site over http on this machine only: search works in full there (over file:// the
# browser blocks the search index's snippets). PORT=8000 by default.
PORT ?= 8000
serve:
	@test -f _build/html/index.html || (echo "Build the site first: make html"; exit 1)
	@echo "Serving http://127.0.0.1:$(PORT)/ (Ctrl-C stops)"
	$(PYTHON) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

# Re-execute notebooks in place after editing them: make execute NB=chapters/01_dot_product_variance.ipynb
execute: $(STAMP)
	$(BIN)/python tools/execute_notebook.py $(NB)

execute-all: $(STAMP)
	$(BIN)/python tools/execute_notebook.py chapters/*.ipynb

# After editing a chapter's Short answer or Common wrong answers: regenerate the summary pages
# (cheat sheet, wrong answers, self-test).
summaries: $(STAMP)
	$(BIN)/python tools/build_summaries.py
	$(BIN)/python tools/build_study.py selftest

# After changing requirements.txt: pin the versions a fresh .venv resolves to.
constraints:
	rm -rf .venv-pin && $(PYTHON) -m venv .venv-pin
	.venv-pin/bin/python -m pip install --quiet -r requirements.txt
	{ sed -n '1,3p' constraints.txt; .venv-pin/bin/python -m pip freeze --exclude-editable | grep -v '^-e'; } > constraints.new
	mv constraints.new constraints.txt && rm -rf .venv-pin

clean:
	rm -rf _build
