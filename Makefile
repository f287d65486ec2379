# Two commands do everything on a fresh machine (Python >= 3.11):
#   make html   build the website into _build/html (creates .venv and installs requirements first)
#   make test   run unit/property tests and re-execute every chapter notebook with nbval
# Also: make pdf (needs the TeX packages in the README), make lab, make execute NB=..., make clean.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
JOBS   ?= 2
STAMP   = $(VENV)/.installed

.PHONY: html pdf test check-site lab execute execute-all summaries clean

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (set PYTHON=...)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (attn_utils)" >/dev/null
	touch $(STAMP)

html: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "Website: $(CURDIR)/_build/html/index.html"

pdf: $(STAMP)
	$(BIN)/jupyter-book build . --builder pdflatex -W -n --keep-going
	@! grep -n "Missing character" _build/latex/*.log || (echo "LaTeX dropped glyphs (see above)"; exit 1)
	@if [ -d _build/html ]; then cp _build/latex/attention-derived.pdf _build/html/; fi
	@echo "PDF: $(CURDIR)/_build/latex/attention-derived.pdf"

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadscope --nbval --nbval-current-env

# After make html: the site works offline (assets local, math rendered by headless Chromium).
check-site: $(STAMP)
	$(BIN)/python -m pytest -p no:xdist -q tests/test_site.py

lab: $(STAMP)
	$(BIN)/python -m pip install --quiet jupyterlab
	$(BIN)/jupyter lab chapters/

# Re-execute notebooks in place after editing them: make execute NB=chapters/01_dot_product_variance.ipynb
execute: $(STAMP)
	$(BIN)/python tools/execute_notebook.py $(NB)

execute-all: $(STAMP)
	$(BIN)/python tools/execute_notebook.py chapters/*.ipynb

# After editing a chapter's Short answer or Common wrong answers: regenerate the two summary pages.
summaries: $(STAMP)
	$(BIN)/python tools/build_summaries.py

clean:
	rm -rf _build
