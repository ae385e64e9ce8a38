# Quick start: `make bench` (install if needed, then the comparison tables) and `make test`.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint bench fuzz clean

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	# torch is pinned: 2.13.0 is the CPU build; an open range pulls a multi-GB CUDA build
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[test,dev,conformance]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(VPY) -m pytest tests

# property-based suite at full size (>= 2,000 cases; prints the count); `make test` runs
# the same properties with the small, derandomized `ci` profile
fuzz: $(STAMP)
	$(VPY) -m pytest tests/fuzz --hypothesis-profile=fuzz -p no:logging

lint: $(STAMP)
	$(VPY) -m ruff check nki_kernels tests benchmarks
	$(VPY) -m ruff format --check nki_kernels tests benchmarks
	$(VPY) -m mypy nki_kernels

bench: $(STAMP)
	$(VPY) -m nki_kernels.cli bench --plot benchmarks/results/speedup.png

clean:
	rm -rf $(VENV) build *.egg-info
