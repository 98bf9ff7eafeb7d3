import sys

from trainfleet.cli.main import main

sys.exit(main())
