# linformer-lab: `make run` and `make test` each set up .venv on a fresh machine first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# CPU build of PyTorch (a plain `torch` would pull a multi-GB CUDA build here). GPU users: install
# their CUDA build of torch into $(VENV) first, then run make with TORCH_SPEC= (empty).
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1

.PHONY: setup run test test-slow tensorboard dashboard clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)")
	$(PY) -m pip install -q -e ".[test,postgres]"
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(VENV)/bin/linformer-lab train experiments/configs/quickstart.yaml experiment=quickstart_full model.attention.kind=full
	$(VENV)/bin/linformer-lab train experiments/configs/quickstart.yaml experiment=quickstart_linformer
	$(PY) -m experiments.summarize runs/quickstart_full runs/quickstart_linformer

test: setup
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-slow: setup
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m slow

tensorboard: setup
	$(VENV)/bin/tensorboard --logdir runs --host $(HOST)

clean:
	rm -rf runs bench .cache
