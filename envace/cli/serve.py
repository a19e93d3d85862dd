"""`envace serve|app`: the two commands that serve on an address until stopped."""

from __future__ import annotations

import argparse
import ipaddress

from envace.cli.flags import with_root
from envace.cli.programs import run_module
from envace.errors import UsageError
from envace.paths import runs_root


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise UsageError(f"--port: expected a port number, got '{text}'") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"--port: must be in 1..65535, got {port}")
    return port


def _host(text: str) -> str:
    if text != "localhost":
        try:
            ipaddress.ip_address(text)
        except ValueError:
            raise UsageError(f"--host: expected an IP address to bind (e.g. 127.0.0.1), got '{text}'") from None
    return text


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise UsageError(f"--gpu-memory: expected a share of the GPU's memory in (0, 1), got '{text}'")
    return value


def _devices(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        ids = []
    if not ids or min(ids) < 0:
        raise UsageError(f"--gpus: expected GPU indices like 0 or 0,1, got '{text}'")
    return ids


def cmd_serve(args: argparse.Namespace) -> int:
    """An OpenAI-compatible vLLM server on a model until Ctrl-C (`envace serve default --port 8000`)."""
    from envace.policy import vllm
    from envace.policy.specs import check_model_spec, model_dir

    check_model_spec(args.model)
    if args.lora is not None and not 1 <= args.lora <= vllm.MAX_LORA_RANK:
        raise UsageError(f"--lora: adapter rank must be in 1..{vllm.MAX_LORA_RANK}, got {args.lora}")
    server = vllm.start(model_dir(args.model), name=args.name, port=args.port, host=args.host, lora_rank=args.lora,
                        max_model_len=args.max_model_len, dtype=args.dtype, gpu_memory=args.gpu_memory,
                        devices=args.gpus)
    print(f"serving {args.model} as '{args.name}' at {server.url} (Ctrl-C stops it); use it with "
          f"--model '{server.url}?model={args.name}&tokenizer={args.model}'", flush=True)
    vllm.serve_forever(server)
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    root = runs_root(args.root)
    return run_module("apps", ["--root", str(root), "--host", args.host, "--port", str(args.port)])


def register(sub) -> None:
    """serve (the server's model, address, adapters, context, dtype and GPU share) and app."""
    p = sub.add_parser("serve", help="an OpenAI-compatible vLLM server on a model (from .venv-vllm: `make vllm`)")
    p.add_argument("model", help="default, tiny, a checkpoint folder, or an id in the local Hugging Face cache")
    p.add_argument("--host", type=_host, default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (default: 8000)")
    p.add_argument("--name", default="base", help="the name requests use for the model (default: base)")
    p.add_argument("--lora", type=int, default=None, metavar="RANK",
                   help="accept LoRA adapters up to this rank, hot-loaded at run time (default: none)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's own, at most 32768)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights' dtype (default: float32; bfloat16 on a GPU)")
    p.add_argument("--gpu-memory", type=_share, default=0.9, metavar="SHARE",
                   help="share of each GPU's memory the server may take, in (0, 1) (default: 0.9; lower it "
                        "when a trainer shares the GPU)")
    p.add_argument("--gpus", type=_devices, default=None, metavar="IDS",
                   help="GPUs the server sees, comma-separated (several: tensor parallel; default: GPU 0)")
    p.set_defaults(func=cmd_serve)

    p = with_root(sub.add_parser("app", help="the workbench app (Gradio) over the run store"))
    p.add_argument("--host", type=_host, default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=7860, help="port (default: 7860)")
    p.set_defaults(func=cmd_app)
