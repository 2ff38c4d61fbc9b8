"""``python -m sparse_dp.cli``: the ``sparse-dp`` command."""

import sys

from sparse_dp.cli import main

sys.exit(main())
