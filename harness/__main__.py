"""``python -m harness`` runs the ``fidelity`` command."""

import sys

from harness.cli import main

sys.exit(main())
