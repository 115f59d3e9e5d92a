"""`python -m app.export ...`: see app/export/__init__.py for the usage."""

import sys

from app.export.cli import main

sys.exit(main())
