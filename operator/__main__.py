"""`python -m pagoda.operator`: the same as `pagoda-operator`."""

import sys

from pagoda.operator.cli import main

sys.exit(main())
