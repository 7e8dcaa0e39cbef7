"""The committed generated protobuf code matches what scripts/gen_proto.sh makes from the .proto files now."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTO_DIR = Path("rocketraft/proto")
GENERATE_TIMEOUT_S = 60


def test_committed_generated_proto_code_is_up_to_date(tmp_path):
    subprocess.run(["bash", "scripts/gen_proto.sh"], cwd=REPO, env=dict(os.environ, OUT_DIR=str(tmp_path)),
                   check=True, capture_output=True, timeout=GENERATE_TIMEOUT_S)
    protos = sorted((REPO / PROTO_DIR).glob("*.proto"))
    assert protos, f"no .proto files under {PROTO_DIR}"
    with_service = [p for p in protos if "\nservice " in p.read_text()]
    expected = sorted([f"{p.stem}_pb2.py" for p in protos] + [f"{p.stem}_pb2_grpc.py" for p in with_service])
    assert sorted(p.name for p in (tmp_path / PROTO_DIR).glob("*_pb2*.py")) == expected
    for name in expected:
        committed = REPO / PROTO_DIR / name
        assert committed.exists(), f"{PROTO_DIR / name} is not committed: run `bash scripts/gen_proto.sh`"
        assert committed.read_text() == (tmp_path / PROTO_DIR / name).read_text(), (
            f"{PROTO_DIR / name} is stale (its .proto changed since it was generated): run `bash scripts/gen_proto.sh`")
