"""``python -m playline`` is the ``playline`` command."""

import sys

from playline.cli import main

sys.exit(main())
