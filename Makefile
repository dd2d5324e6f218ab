# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# `make test` runs the whole suite; `make test-fast` (under a minute, for the edit-test loop) leaves out the tests
# marked distributed, slow or subprocess in pyproject.toml: every launcher run and every training in a subprocess.
# Both run TEST_JOBS pytest-xdist workers (3 on 2 cores: many tests wait for launches, timeouts and other processes,
# and a third worker fills those waits; 305 s against 337 s with 2 here. A test file stays in one worker; the shared
# runs train once: tests/shared_runs.py).
# A test's `python ...` command runs in a fork of a Python that imported Paddle once (tests/warm_python.py);
# MTL_TESTS_COLD=1 starts a new interpreter for each instead.
# The Paddle wheel: DEVICE=auto (GPU wheel when nvidia-smi works), gpu or cpu; CUDA=cu118|cu126|cu129 picks the GPU
# build (default: the newest the driver runs). `make paddle-wheel` prints the choice and the pip commands only.
PYTHON ?= python3
DEVICE ?= auto
CUDA ?=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(DEVICE)
EXTRAS := $(VENV)/.installed-extras
SELECT_PADDLE = tools/select_paddle.py --device $(DEVICE) $(if $(CUDA),--cuda $(CUDA))
PYTEST_ARGS ?=
TEST_JOBS ?= 3

.PHONY: demo test test-fast bench lint venv clean paddle-wheel

venv: $(STAMP)

$(STAMP): requirements.txt setup.py tools/select_paddle.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) $(SELECT_PADDLE) --python $(PY)
	@# setuptools boxes an "Editable installation" note (folders named like the package) that is not ours to act on
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# optional extra: ONNX export (paddle2onnx, onnxruntime) and VisualDL scalars; `make test` installs it
$(EXTRAS): requirements-extras.txt $(STAMP)
	$(PY) -m pip install --quiet -r requirements-extras.txt
	touch $(EXTRAS)

paddle-wheel:
	$(PYTHON) $(SELECT_PADDLE) --python $(PY) --dry-run

demo: $(STAMP)
	$(PY) examples/train_joint.py --overwrite

.PHONY: demo-faces
FACES_DEMO := runs/faces_demo
demo-faces: $(STAMP)  ## six real face datasets, open set: the recipe (six heads, cross-head negatives) for one seed, the classic baselines, the estimated same-person pairs
	@echo "Six face datasets, one backbone: one seed of the recipe and the classic baselines, scored on the" \
	    "validation people of examples/configs/faces_six.yaml (a line as each run ends, and every 30 s while one trains; about 5 minutes on 2 cores)"
	$(PY) examples/faces_report.py --seeds 0 --arms cross --overlap --out $(FACES_DEMO) --json $(FACES_DEMO)/report.json
	@echo "These are the validation people, on which every setting of the recipe was chosen, and one seed; the" \
	    "README's table is on other people, the test people (examples/configs/faces_six_test.yaml, looked at once)," \
	    "over 3 seeds, so its figures differ (docs/faces.md has both tables)."
	@echo "Report: $(FACES_DEMO)/report.md and report.json; plot: $(FACES_DEMO)/roc_all_people.png"

.PHONY: demo-text
demo-text: $(STAMP)  ## the English Web Treebank recipe, one seed, shortened: joint and each task alone (under 5 minutes)
	@echo "The English Web Treebank recipe, shortened to a smoke run: 100 of its 4800 steps, one seed, the joint run" \
	    "and each task alone (a line per run; 5 to 8 minutes on 2 cores). At 100 steps the figures stay near their" \
	    "starting values: this checks that every run trains, evaluates and is reported, nothing more."
	OMP_NUM_THREADS=1 $(PY) examples/text_report.py --seeds 0 --steps 100 --only joint alone --out runs/text_demo \
		--json runs/text_demo/report.json
	@echo "The recipe's figures (4800 steps, 3 seeds: UPOS 93.28, LAS 76.42, NER F1 60.31, joint and each task" \
	    "alone) are in docs/text.md; report: runs/text_demo/report.json"

# The tests' temporary folders (pytest's tmp_path, the launches' logs) on a RAM disk when the machine has one with
# 4 GB free: the suite's runs write hundreds of checkpoints, each file and folder fsynced, and an fsync of the disk
# here costs milliseconds (a 12-step run with 3 checkpoints: 4.7 s on /tmp, 1.9 s on /dev/shm). TEST_TMPDIR= keeps
# the system's temporary folder. pyproject's tmp_path_retention_policy removes a passed test's folder at its end.
TEST_TMPDIR ?= $(shell [ -d /dev/shm ] && [ "$$(df -Pk /dev/shm | awk 'NR == 2 {print $$4}')" -gt 4000000 ] \
	2>/dev/null && echo /dev/shm/mtl-tests-$$(id -u))
# Compiled bytecode of every module the tests' processes import, kept in TEST_PYCACHE (outside the checkout and the
# virtual environment) even where PYTHONDONTWRITEBYTECODE is set: each of the suite's hundreds of Python processes
# compiled mtl, tests and part of Paddle from source again (a 2-step training process: 2.1 s -> 1.6 s).
TEST_PYCACHE ?= $(if $(TEST_TMPDIR),$(TEST_TMPDIR)/pycache,/tmp/mtl-pycache-$(shell id -u))
TEST_ENV = $(if $(TEST_TMPDIR),TMPDIR=$(TEST_TMPDIR)) PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(TEST_PYCACHE) \
	OMP_NUM_THREADS=1

test: $(STAMP) $(EXTRAS)
	$(if $(TEST_TMPDIR),mkdir -p $(TEST_TMPDIR))
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

test-fast: $(STAMP) $(EXTRAS)
	$(if $(TEST_TMPDIR),mkdir -p $(TEST_TMPDIR))
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not distributed and not slow and not subprocess" $(PYTEST_ARGS)

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs .pytest_cache build *.egg-info
