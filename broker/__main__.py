from serverkit.grpc_env import quiet_grpc_logs

quiet_grpc_logs()  # before grpc is imported
import sys  # noqa: E402

from .server import main  # noqa: E402

sys.exit(main())
