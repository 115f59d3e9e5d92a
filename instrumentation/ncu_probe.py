"""`python -m instrumentation.ncu_probe`: the documented entry point (the forward pass the sweep runs
under Nsight Compute). The command is instrumentation.recording.ncu_probe."""

import sys

from instrumentation.recording.ncu_probe import main

if __name__ == "__main__":
    sys.exit(main())
