"""``python -m stabilizer.bench``: the remediation benchmark (``stabilizer.bench.remediation``)."""

import sys

from stabilizer.bench.remediation import main

sys.exit(main())
