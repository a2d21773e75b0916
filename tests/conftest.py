"""The unit tests' shared helpers, one of each. They live in modules of this folder, put on
sys.path here (the suite runs in importlib mode with the repository root off sys.path):

* ports.py: `free_port`, for the tests that must name a port before they listen;
* protocol.py: `raw_frame` (an AMQP frame by hand), `connected` (a connection machine past its
  handshake) and `feed` (bytes in, events out), all without sockets;
* doubles.py: `HeldExecutor`, a worker thread that runs its jobs only when told to.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
