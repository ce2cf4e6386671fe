#!/usr/bin/env bash
# Generates the Python gRPC stubs for the kubelet plugin protocols in proto/ into
# thunder_dra/proto_gen/ (messages, services and .pyi type stubs), using grpcio-tools'
# bundled protoc so the output depends only on the pinned grpcio-tools version.
#
#   release/gen-proto.sh              # regenerate thunder_dra/proto_gen/
#   release/gen-proto.sh OUT_DIR      # generate into OUT_DIR instead (the sync test does this)
#   PYTHON=/path/to/python release/gen-proto.sh   # use another interpreter with grpcio-tools
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/thunder_dra/proto_gen"}
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$root/.venv/bin/python" ]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: protoc runs from proto/
rm -f "$out"/*_pb2.py "$out"/*_pb2.pyi "$out"/*_pb2_grpc.py

cd "$root/proto"
"$PYTHON" -m grpc_tools.protoc -I . \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  ./*.proto

# protoc writes top-level imports ("import dra_v1_pb2 as ..."), which only work with the
# output directory on sys.path; make them package imports.
for f in "$out"/*_pb2_grpc.py "$out"/*_pb2.py "$out"/*_pb2.pyi; do
  sed -i -E 's/^import ([A-Za-z0-9_]+_pb2) as /from thunder_dra.proto_gen import \1 as /' "$f"
done

# Drop the generated servicer base classes. They only answer UNIMPLEMENTED for methods a
# subclass does not override; every service this project serves implements every method
# of its own class, registered with the add_*_to_server functions that remain.
"$PYTHON" - "$out"/*_pb2_grpc.py <<'PY'
import re
import sys

for name in sys.argv[1:]:
    with open(name) as f:
        text = f.read()
    text = re.sub(r"\nclass \w+Servicer:\n(?:(?:    .*|)\n)*?(?=\n\S)", "\n", text)
    with open(name, "w") as f:
        f.write(text)
PY

cat > "$out/__init__.py" <<'PY'
"""Generated gRPC stubs for the kubelet plugin protocols in proto/ (release/gen-proto.sh).

Do not edit; regenerate. Modules: pluginregistration_v1, dra_v1, dra_v1beta1,
dra_health_v1, dra_health_v1alpha1, each as ``<name>_pb2`` (messages) and
``<name>_pb2_grpc`` (services).
"""
PY
