"""`python -m trainfleet.catalog [--markdown]`."""

import sys

from trainfleet.catalog import main

sys.exit(main())
