"""Check a running server: `python scripts/check_server.py URL --output REPORT.md`.

Same as `resin check URL ...`; see `resin_app.check` for what is checked.
"""

import sys

from resin_app.check import main

if __name__ == "__main__":
    sys.exit(main())
