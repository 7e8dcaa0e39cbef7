"""`python -m namesrv --listen 127.0.0.1:9876`: run one NameServer until SIGTERM/SIGINT."""

import sys

from namesrv.server import main

sys.exit(main())
