"""`python -m envace.cli …`: the `envace` command, as torchrun, the launcher and the tests start it."""

import sys

from envace.cli import main

sys.exit(main())
