"""Start the radt dashboard from a checkout: `python app.py [--store URI] [--host 127.0.0.1] [--port 8050]`.

The same as `radt dashboard ...` (app/main.py). For several users:
`gunicorn -w 4 -b 0.0.0.0:8050 'radt.app:server'` with RADT_CACHE=redis://127.0.0.1:6379/0.
"""

import sys

from radt.errors import UserError
from radt.settings import check_settings

if __name__ == "__main__":
    try:
        check_settings()  # before the dashboard's modules read them at import: one line, not a traceback
    except UserError as exc:
        print(f"radt dashboard: {exc}", file=sys.stderr)
        sys.exit(2)
    from radt.app.main import main

    sys.exit(main())
