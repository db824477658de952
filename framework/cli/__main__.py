"""``python -m adaptive_decoding.framework.cli`` = ``adec``."""

import sys

from adaptive_decoding.framework.cli.main import main

sys.exit(main())
