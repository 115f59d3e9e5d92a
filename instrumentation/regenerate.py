"""`python -m instrumentation.regenerate`: the documented entry point. The command is instrumentation.cli.regenerate."""

import sys

from instrumentation.cli.regenerate import main

if __name__ == "__main__":
    sys.exit(main())
