#!/usr/bin/env bash
# Regenerates rocketraft/proto/*_pb2*.py from rocketraft/proto/*.proto (OUT_DIR overrides the target).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT_DIR:-.}"
mkdir -p "$out/rocketraft/proto"
# Message modules for every .proto; gRPC stubs only for those that declare a service.
.venv/bin/python -m grpc_tools.protoc -I . --python_out="$out" rocketraft/proto/*.proto
.venv/bin/python -m grpc_tools.protoc -I . --grpc_python_out="$out" $(grep -l '^service ' rocketraft/proto/*.proto)
