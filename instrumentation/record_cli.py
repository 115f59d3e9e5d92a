"""`python -m instrumentation.record_cli`: the documented entry point. The command is instrumentation.cli.flash."""

import sys

from instrumentation.cli.flash import main

if __name__ == "__main__":
    sys.exit(main())
