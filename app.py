"""Start the radt dashboard from a checkout: `python app.py [--store URI] [--host 127.0.0.1] [--port 8050]`.

The same as `radt dashboard ...` (app/main.py). For several users:
`gunicorn -w 4 -b 0.0.0.0:8050 'radt.app:server'` with RADT_CACHE=redis://127.0.0.1:6379/0.
"""

import sys

from radt.app.main import main

if __name__ == "__main__":
    sys.exit(main())
