"""``python -m stabilizer.cli``: the ``stabilizer`` command."""

import sys

from stabilizer.cli.commands import main

sys.exit(main())
