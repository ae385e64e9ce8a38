# Quick start: `make bench` (install if needed, then the one-screen benchmark summary) and `make test`.
PY ?= python3
# the checkout's folder, so `make -f path/to/Makefile bench` works from any directory
ROOT := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
VENV ?= $(ROOT).venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint bench fuzz clean

$(STAMP): $(ROOT)pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	# torch is pinned: 2.13.0 is the CPU build; an open range pulls a multi-GB CUDA build
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '$(ROOT)[test,dev,conformance,hf,integrations]'
	# TorchTitan without its trainer-side dependencies (see the integrations extra)
	$(VPY) -m pip install -q --no-deps torchtitan==0.3.0
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	cd $(ROOT) && $(VPY) -m pytest tests

# property-based suite at full size (>= 2,000 cases; prints the count); `make test` runs
# the same properties with the small, derandomized `ci` profile
fuzz: $(STAMP)
	cd $(ROOT) && $(VPY) -m pytest tests/fuzz --hypothesis-profile=fuzz -p no:logging

lint: $(STAMP)
	cd $(ROOT) && $(VPY) -m ruff check nki_kernels tests benchmarks
	cd $(ROOT) && $(VPY) -m ruff format --check nki_kernels tests benchmarks
	cd $(ROOT) && $(VPY) -m mypy nki_kernels

bench: $(STAMP)
	$(VPY) -m nki_kernels.cli bench

clean:
	cd $(ROOT) && rm -rf $(VENV) build *.egg-info
