# One-command setup: both targets create .venv and install schedlab if needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.schedlab-installed
# The torch release the project is tested with (CPU build). GPU users: see README.
TORCH  := torch==2.13.0

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev,real]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/schedlab compare --pp 4 --microbatches 8 --chunks 2 --out out

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python experiments/bench_sim.py

lint: $(STAMP)
	$(BIN)/ruff check schedules sim real analysis tests experiments

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis *.egg-info
