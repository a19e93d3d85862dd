"""`python -m apps --root runs --host 127.0.0.1 --port 7860`: what `envace app` runs (it checks the flags first)."""

from __future__ import annotations

import argparse

from apps.app import serve

parser = argparse.ArgumentParser(prog="envace app")
parser.add_argument("--root", default="runs")
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=7860)
args = parser.parse_args()
print(f"EnvACE Workbench on http://{args.host}:{args.port} over {args.root} (Ctrl-C stops it)", flush=True)
try:
    serve(args.root, args.host, args.port)
except KeyboardInterrupt:
    pass
