"""The corpus runs each program in a subprocess of its own: nothing here needs a leak check
beyond the programs exiting (``corpus.run`` waits for them)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
