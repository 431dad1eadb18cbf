# Every target creates .venv and installs what it needs on a fresh machine.
PY := .venv/bin/python
STAMP := .venv/.resin-installed

.PHONY: install test lint format bench serve chat assets

$(STAMP): pyproject.toml scripts/setup_venv.sh
	bash scripts/setup_venv.sh
	touch $(STAMP)

install: $(STAMP)

assets: $(STAMP)
	bash scripts/fetch_test_assets.sh

test: $(STAMP) assets
	$(PY) -m pytest -q -n 2 --timeout 900

lint: $(STAMP)
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/vulture src scripts vulture_allow.py --min-confidence 60

format: $(STAMP)
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) scripts/bench_engine.py --output bench/engine.jsonl

serve: $(STAMP)
	.venv/bin/resin serve

chat: $(STAMP)
	.venv/bin/resin chat
