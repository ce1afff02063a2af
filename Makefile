# One-command setup: both targets create .venv and install schedlab if needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.schedlab-installed
# The torch release the project is tested with (CPU build). GPU users: see README.
TORCH  := torch==2.13.0

.PHONY: demo run test test-fast bench lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev,real,data,metrics,exports,elastic]' $(TORCH)  # torch stays the pinned build
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/schedlab compare --pp 4 --microbatches 8 --chunks 2 --out out
	$(BIN)/schedlab compare --model gpt-6.2b --cluster dgx-h100:2 --pp 8 --dp 2 --dp-mode ddp \
		--microbatches 32 --chunks 2 --schedules 1f1b,zb-h1,interleaved-1f1b,zb-v
	for r in none full "selective --sp"; do $(BIN)/schedlab compare --model gpt3-175b --cluster dgx-a100:8 --tp 8 \
		--pp 8 --microbatches 64 --chunks 3 --schedules 1f1b,interleaved-1f1b --recompute $$r || exit 1; done
	$(BIN)/schedlab report --out out/report
	$(BIN)/python -m real.data prepare --input README.md --out out/corpus.u16
	$(BIN)/schedlab run --schedule 1f1b --pp 2 --microbatches 4 --steps 20 --data out/corpus.u16 --vocab 256 --seq 32

# Real training: the GPT model with 1F1B on 2 CPU processes (torchrun, gloo); trace + timeline in out/.
run: $(STAMP)
	$(BIN)/schedlab run --schedule 1f1b --pp 2 --microbatches 8 --steps 20 --trace out/real.csv --plot out/real.png

# Two pytest-xdist workers, one per core; a test file stays on one worker (its fixtures run once). A crashed
# worker ends the run (pytest-xdist 3.8 with loadfile can wait forever for a replaced worker: xdist #784/#1327).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --max-worker-restart 0

# The single-process tests only (no torchrun launches or subprocesses, none of the few slowest): under 90 s.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python experiments/bench_sim.py

lint: $(STAMP)
	$(BIN)/ruff check schedules sim real analysis tests experiments

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis *.egg-info
