"""The application above the runners: `resin serve | chat | bench | check | worker` (`cli.py`),
what they load (`loading.py`, runner families found by `runners.py`), and the bench and check
tools."""
