# Set-up and entry points. `make demo` and `make test` work on a fresh clone with only Python 3.10+.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is pinned here (a local wheel on the project's machines); the package itself asks for a range.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
# PyPI's Linux torch wheels are CUDA builds (4.1 GB of CUDA libraries and Triton in a 6.4 GB venv); where the PyTorch
# index is reachable, `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the CPU-only build instead
TORCH_INDEX ?=

.PHONY: demo test test-fast test-install test-app bench install clean style quality typecheck docs

$(VENV)/.base: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH_PINS)
	$(PY) -m pip install --quiet -e .
	touch $@

# the test extra and deepspeed (the `deepspeed` extra, for the ZeRO-3 tests): deepspeed's source package builds against
# the installed torch, so without build isolation (which would fetch another torch), its build helpers first; its ops
# are not built (76 s in a fresh venv with only torch, on the 2-core machine under load)
DEEPSPEED_BUILD := 'setuptools>=64' wheel hjson msgpack ninja py-cpuinfo
$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install --quiet $(DEEPSPEED_BUILD)
	$(PY) -m pip install --quiet --no-build-isolation -e '.[test,deepspeed]'
	$(PY) -m pip install --quiet --no-deps --target $(TORCHAO_SITE) 'torchao>=0.16,<0.19'
	touch $@

# torchao beside the venv, not in it: imported, it makes every `import diffusers` print warnings (torch 2.14.1), so
# only the quantisation test's subprocess puts it on its path (tests/integrations/test_diffusers_torchao.py)
TORCHAO_SITE := $(abspath $(VENV))/torchao-site
export MMPOS_TORCHAO_SITE := $(TORCHAO_SITE)

# ruff, mypy, pre-commit and the docs site (the `dev` extra)
$(VENV)/.dev: $(VENV)/.test
	$(PY) -m pip install --quiet -e '.[test,dev]'
	touch $@

install: $(VENV)/.base

demo: $(VENV)/.base
	$(VENV)/bin/mmpos demo --out outputs/demo --overwrite

test: $(VENV)/.test
	$(PY) -m pytest -q

# the unit tests: everything but the end-to-end files that took most of `make test`'s time (pytest --durations=0,
# 2-core machine, 2026-12-01: documentation 118 s, compile 83 s, world_demo 36 s, world_video 24 s, train_vit 23 s,
# edit_cli 16 s of 462 s; edit_cli_families, added later: 37 s, 90 s on a busier machine); and the files of 2-process
# (torchrun) runs and other long ones added since (2026-12-02: zero3 126 s, context_parallel 140 s, fsdp_* 107 s,
# training_interrupt 70 s, world_training 68 s, ...: with them `make test-fast` took 14 min); `make test` runs them too
FAST_EXCLUDE := tests/project/test_documentation.py tests/encodings/test_compile.py tests/commands/test_world_demo.py tests/pipelines/test_world_video.py \
	tests/training/test_train_vit.py tests/commands/test_edit_cli.py tests/commands/test_edit_cli_families.py \
	tests/integrations/test_zero3.py tests/integrations/test_fsdp_resume.py tests/integrations/test_fsdp_dit.py \
	tests/integrations/test_fsdp_timm.py tests/integrations/test_context_parallel.py \
	tests/integrations/test_context_parallel_refusal.py tests/training/test_training_interrupt.py \
	tests/training/test_world_training.py tests/training/test_training_scaffold.py tests/project/test_no_data_loss.py \
	tests/project/test_packaging.py tests/pipelines/test_loose_families.py \
	tests/project/test_concurrent_outputs.py tests/pipelines/test_edit_sweep.py tests/app \
	tests/commands/test_tiny_pipeline_cli.py
test-fast: $(VENV)/.test
	$(PY) -m pytest -q $(addprefix --ignore=,$(FAST_EXCLUDE))

# a non-editable install: build a wheel from a clean copy, check its data files, import it from a plain folder
test-install: $(VENV)/.test
	MMPOS_SLOW=1 $(PY) -m pytest -q tests/project/test_install.py

# `mmpos app`: the page's API tests (gradio_client) and its browser test in the system Chromium (Playwright for Python
# drives /usr/bin/chromium; Playwright's own browser download is not used), which saves the docs' screenshots
$(VENV)/.app: $(VENV)/.test
	$(PY) -m pip install --quiet -e '.[test,app-test]'
	touch $@

test-app: $(VENV)/.app
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	MMPOS_APP_SCREENSHOTS=docs/images $(PY) -m pytest -q tests/app

bench: $(VENV)/.test
	$(PY) benchmarks/bench_rotary.py --out outputs/bench_rotary.json

# as in diffusers: `make style` rewrites (import order, lint fixes, format), `make quality` only checks
CHECK_DIRS := mmpos pipelines tests benchmarks scripts setup.py
style: $(VENV)/.dev
	$(VENV)/bin/ruff check $(CHECK_DIRS) --fix
	$(VENV)/bin/ruff format $(CHECK_DIRS)

quality: $(VENV)/.dev
	$(VENV)/bin/ruff check $(CHECK_DIRS)
	$(VENV)/bin/ruff format --check $(CHECK_DIRS)
	$(MAKE) typecheck

# mypy on the core packages (the files and rules are in pyproject.toml, [tool.mypy])
typecheck: $(VENV)/.dev
	$(VENV)/bin/mypy

# the API reference and guide site (mkdocs.yml); --strict: a broken reference or link fails the build
docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir outputs/site

clean:
	rm -rf $(VENV) outputs
