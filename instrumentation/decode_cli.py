"""`python -m instrumentation.decode_cli`: the documented entry point. The command is instrumentation.cli.decode."""

import sys

from instrumentation.cli.decode import main

if __name__ == "__main__":
    sys.exit(main())
