"""``python -m harness`` runs the ``fidelity`` command."""

import sys

from harness.cli.main import main

sys.exit(main())
