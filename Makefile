# hethpc: every target sets up what is missing first (scripts/setup.sh is idempotent).
PY      := .venv/bin/python
MPIRUN  := scripts/mpirun.sh
# Bound every mpirun so a hang cannot outlive its run (seconds).
export HETHPC_MPIRUN_TIMEOUT ?= 900
export OMP_NUM_THREADS ?= 1
PYTEST_MPI := $(PY) -m mpi4py -m pytest -q --color=no -p no:cacheprovider tests/mpi

.PHONY: setup demo demo-testbed test test-single test-mpi bench lint docs clean

setup:
	@bash scripts/setup.sh

## The README's main command: 2 ranks (rank 1 emulated 2x slower) train on label-skewed
## MNIST-1D with dynamic batching and SelSync (jobs/demo.toml); then a baseline on the
## same data and slow rank (uniform batches, BSP every step, at its own tuned learning rate);
## then plots of both side by side.
demo: setup
	$(MPIRUN) -np 2 $(PY) jobs/train.py --config jobs/demo.toml --overwrite $(ARGS)
	$(MPIRUN) -np 2 $(PY) jobs/train.py --config jobs/demo.toml --overwrite --lr 0.2 $(ARGS) \
	    --run-dir runs/demo-baseline --batching uniform --sync bsp
	$(PY) jobs/report.py runs/demo runs/demo-baseline

## The demo on the testbed (root, Linux; docs/testbed.md): the same two runs with no emulation,
## rank 1 on a node capped at half a core, both nodes' links shaped to 200 Mbit/s by the kernel.
TESTBED := $(PY) jobs/testbed.py --name demo run --node cpu=1,link=200mbit --node cpu=0.5,link=200mbit --
demo-testbed: setup
	$(TESTBED) $(MPIRUN) -np 2 $(PY) jobs/train.py --config jobs/demo.toml --overwrite \
	    --slowdown '' --link '' --run-dir runs/demo-testbed $(ARGS)
	$(TESTBED) $(MPIRUN) -np 2 $(PY) jobs/train.py --config jobs/demo.toml --overwrite --lr 0.2 \
	    --slowdown '' --link '' --run-dir runs/demo-testbed-baseline --batching uniform --sync bsp $(ARGS)
	$(PY) jobs/report.py runs/demo-testbed runs/demo-testbed-baseline

## The README's test command: single-process tests, then the distributed ones on 2 ranks with
## the CPU's default tensor transport (mpi4py) and on 3 ranks through Horovod (the pipeline's on
## 4 ranks run from tests/test_pipeline_mpirun.py).
test: setup
	$(MAKE) --no-print-directory test-single test-mpi

test-single:
	$(PY) -m pytest -q tests

test-mpi:
	$(MPIRUN) -np 2 $(PYTEST_MPI)
	HETHPC_TEST_TRANSPORT=horovod $(MPIRUN) -np 3 $(PYTEST_MPI)

bench: setup
	$(PY) benchmarks/run_all.py $(ARGS)

lint: setup
	$(PY) -m ruff check hethpc jobs data_tools benchmarks tests
	$(PY) -m mypy

## docs/settings.md, the reference of every setting, from hethpc/train/settings/fields.py.
docs: setup
	$(PY) -c "from hethpc.train.settings.doc import settings_markdown as m; print(m(), end='')" \
	    > docs/settings.md

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache *.egg-info
