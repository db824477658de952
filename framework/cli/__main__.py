"""``python -m framework.cli`` = ``adec``."""

import sys

from framework.cli.main import main

sys.exit(main())
