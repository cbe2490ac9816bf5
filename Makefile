# linformer-lab: `make run` and `make test` each set up .venv on a fresh machine first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# CPU build of PyTorch (a plain `torch` would pull a multi-GB CUDA build here). GPU users: install
# their CUDA build of torch into $(VENV) first, then run make with TORCH_SPEC= (empty).
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1

.PHONY: setup run test test-fast test-slow lint format tensorboard dashboard clean gpu-check

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)")
	$(PY) -m pip install -q -e ".[test,lint,postgres,refs]"
	touch $(STAMP)

setup: $(STAMP)

# The quickstart study: sweeps/random_vs_learned.yaml at its CPU preset (its control first: full attention
# vs a Linformer whose k is too small), 2 worker processes, then its report. Re-running resumes the study
# (a finished one is not re-run). Clean: rm -rf runs/$(QUICKSTART).
QUICKSTART := random_vs_learned_cpu
WORKERS ?= 2
run: setup
	$(VENV)/bin/linformer-lab sweep sweeps/random_vs_learned.yaml --preset cpu --workers $(WORKERS)
	$(VENV)/bin/linformer-lab report sweeps/random_vs_learned.yaml --preset cpu
	@echo "report:      runs/$(QUICKSTART)/report/summary.md  (the answer first, then the control's power check; trials.csv, *.png beside it)"
	@echo "tensorboard: $(VENV)/bin/tensorboard --logdir runs/$(QUICKSTART) --host $(HOST)"
	@echo "dashboard:   $(VENV)/bin/linformer-lab dashboard sweeps/random_vs_learned.yaml --preset cpu --host $(HOST)   (or: make dashboard)"

test: setup
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n auto --dist worksteal

# The default suite less the tests that start a child process (marker `processes`: CLI runs, sweep workers, DDP
# ranks, loader workers); `make test` runs them too.
test-fast: setup
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n auto --dist worksteal -m 'not slow and not postgres and not processes'

test-slow: setup
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m slow

# ruff (lint and format check) and import-linter (the floors in pyproject.toml: nothing imports upward).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The GPU measurement kit (docs/gpu.md): bench, a trial pair, the preflight, a tiny study and the suite on this
# machine's CUDA device, into gpu-check-out/table.md. Needs .venv with a CUDA torch (make setup TORCH_SPEC=), so it
# installs nothing itself. PARTS: a subset of "bench trial preflight study tests".
gpu-check:
	bash .ci/gpu-check.sh $(PARTS)

tensorboard: setup
	$(VENV)/bin/tensorboard --logdir runs --host $(HOST)

# Optuna's dashboard on a study and its control, read only (default the quickstart study):
# make dashboard STUDY=sweeps/<study>.yaml PRESET=gpu [PORT=8080]; for an RDB study add ARGS="--storage URL".
STUDY ?= sweeps/random_vs_learned.yaml
PRESET ?= cpu
PORT ?= 8080
dashboard: setup
	$(VENV)/bin/linformer-lab dashboard $(STUDY) --preset $(PRESET) --host $(HOST) --port $(PORT) $(ARGS)

clean:
	rm -rf runs bench .cache
