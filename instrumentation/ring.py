"""`python -m instrumentation.ring`: the documented entry point. The command is instrumentation.cli.ring."""

import sys

from instrumentation.cli.ring import main

if __name__ == "__main__":
    sys.exit(main())
