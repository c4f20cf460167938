"""``python -m aiocollect._cli``: the ``aiocollect`` command, as ``python -m aiocollect`` is."""

import sys

from . import main

sys.exit(main())
