"""The reproductions' short forms run against real local clusters, as `python -m bench repro <name> --quick`."""

from __future__ import annotations

import logging

# The official SDK logs every retry at ERROR; keep test output readable.
logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
