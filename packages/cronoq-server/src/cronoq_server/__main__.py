"""``python -m cronoq_server``: the ``cronoq-server`` command."""

import sys

from cronoq_server._cli import main

sys.exit(main())
