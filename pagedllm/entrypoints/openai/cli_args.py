"""The server's own flags (beside EngineArgs'); kept free of server imports so `--help` stays fast."""
from __future__ import annotations

import argparse
import json

from pagedllm.lora.request import LoRARequest

DEFAULT_MAX_REQUEST_BODY_BYTES = 16 << 20
DEFAULT_MAX_WAITING_REQUESTS = 1024
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0


def add_server_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--host", default=None, help="Host name to listen on (default: all interfaces).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None,
                        help="Require this key as `Authorization: Bearer <key>` on /v1 (or set VLLM_API_KEY).")
    parser.add_argument("--chat-template", default=None, help="A chat template file, or the template itself.")
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="Accept a `chat_template` in chat requests (it runs on the server).")
    parser.add_argument("--root-path", default=None, help="The path prefix when behind a path-based proxy.")
    parser.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                        help="Larger request bodies are refused with 413.")
    parser.add_argument("--max-waiting-requests", type=int, default=DEFAULT_MAX_WAITING_REQUESTS,
                        help="Sequences that may wait beyond max_num_seqs; more are refused with 503 and "
                             "Retry-After (negative: no limit).")
    parser.add_argument("--request-timeout", type=float, default=None,
                        help="Abort a request still unfinished after this many seconds (504).")
    parser.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                        help="On SIGTERM, seconds to let requests in flight finish before aborting them.")
    parser.add_argument("--disable-frontend-multiprocessing", action="store_true",
                        help="Run the engine in the server's process (AsyncLLMEngine) instead of its own.")
    parser.add_argument("--lora-modules", type=parse_lora_module, nargs="+", default=None,
                        help="LoRA adapters requests may name as their model: name=path, or JSON "
                             '\'{"name": ..., "path": ..., "base_model_name": ...}\' (needs --enable-lora).')
    parser.add_argument("--uvicorn-log-level", default="info",
                        choices=["debug", "info", "warning", "error", "critical", "trace"])
    return parser


def parse_lora_module(text: str) -> LoRARequest:
    """`name=path`, or vLLM's JSON form `{"name": ..., "path": ..., "base_model_name": ...}`; the id is given
    when the server registers it."""
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
            return LoRARequest(spec["name"], 1, spec["path"], base_model_name=spec.get("base_model_name"))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise argparse.ArgumentTypeError(f"Invalid JSON LoRA module {text!r}: {error}") from None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"Invalid LoRA module {text!r}: expected name=path or JSON.")
    return LoRARequest(name, 1, path)
