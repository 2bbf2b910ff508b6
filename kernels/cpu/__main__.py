"""`python -m pagoda.kernels.cpu`: build the CPU kernels now, not at first use."""

import sys
import time

from pagoda.kernels.cpu import build

start = time.perf_counter()
module = build()
print(f"pagoda CPU kernels ready ({module.__file__}) in {time.perf_counter() - start:.1f} s")
sys.exit(0)
