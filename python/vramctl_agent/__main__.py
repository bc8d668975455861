"""`python3 -m vramctl_agent` is the debugging client (vramctl_agent.client)."""

import sys

from .client import main

sys.exit(main())
