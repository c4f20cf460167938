"""``python -m aiocollect``: the ``aiocollect`` command (see ``aiocollect._cli``)."""

import sys

from ._cli import main

sys.exit(main())
