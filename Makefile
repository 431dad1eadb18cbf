# Every target creates .venv and installs what it needs on a fresh machine: `make serve` only
# what serving the default model needs, `make test` (and lint) everything else too.
PY := .venv/bin/python
SERVE_STAMP := .venv/.resin-serve
STAMP := .venv/.resin-installed

.PHONY: install test lint format bench serve chat assets

$(SERVE_STAMP): pyproject.toml scripts/setup_venv.sh
	bash scripts/setup_venv.sh serve
	touch $(SERVE_STAMP)

$(STAMP): $(SERVE_STAMP)
	bash scripts/setup_venv.sh test
	touch $(STAMP)

install: $(STAMP)

assets: $(STAMP)
	bash scripts/fetch_test_assets.sh

# Tests marked `serial` time a server under load: they run alone, after the parallel run.
test: $(STAMP) assets
	$(PY) -m pytest -q -n 2 --timeout 900 -m "not serial"
	$(PY) -m pytest -q --timeout 900 -m serial

lint: $(STAMP)
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/vulture src vulture_allow.py --min-confidence 60

format: $(STAMP)
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

bench: $(STAMP)
	.venv/bin/resin bench engine --output bench/engine.jsonl

serve: $(SERVE_STAMP)
	.venv/bin/resin serve $(ARGS)

chat: $(SERVE_STAMP)
	.venv/bin/resin chat $(ARGS)
