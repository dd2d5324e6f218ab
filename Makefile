# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test bench lint venv clean

venv: $(STAMP)

$(STAMP): requirements.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_joint.py --overwrite

.PHONY: demo-faces
demo-faces: $(STAMP)  ## the real-face recipe (ORL, open set): baselines, joint and each dataset alone, one seed
	$(PY) examples/faces_orl_report.py --seeds 0 --out runs/faces_orl_report

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs .pytest_cache build *.egg-info
