"""The `pagedllm` command: generate, chat, serve."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from pagedllm.config import AsyncEngineArgs, EngineArgs
from pagedllm.sampling_params import SamplingParams


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed-sampling", dest="sampling_seed", type=int, default=None,
                        help="Per-request sampling seed.")


def _sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.sampling_seed)


def _engine(args: argparse.Namespace):  # noqa: ANN202 - LLM is imported lazily to keep --help fast
    from pagedllm.engine.llm import LLM

    engine_args = EngineArgs.from_cli_args(args)
    fields = {k: v for k, v in vars(engine_args).items() if k != "model"}
    return LLM(engine_args.model, **fields)


def generate(args: argparse.Namespace) -> None:
    llm = _engine(args)
    for output in llm.generate(args.prompt, _sampling_params(args), use_tqdm=False):
        print(output.prompt + output.outputs[0].text)


def chat(args: argparse.Namespace) -> None:
    llm = _engine(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("Chat with the model; an empty line or Ctrl-D ends it.")
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            break
        if not line:
            break
        messages.append({"role": "user", "content": line})
        reply = llm.chat(messages, _sampling_params(args), use_tqdm=False)[0].outputs[0].text
        print(reply)
        messages.append({"role": "assistant", "content": reply})


def serve(args: argparse.Namespace) -> None:
    from pagedllm.entrypoints.openai.api_server import run_server

    if args.model_tag is not None:
        args.model = args.model_tag
    run_server(args)


def _add_serve_parser(commands: argparse._SubParsersAction) -> None:
    from pagedllm.entrypoints.openai.cli_args import add_server_args

    server = commands.add_parser("serve", help="Start the OpenAI-compatible HTTP server.")
    server.add_argument("model_tag", nargs="?", default=None, help="The model (same as --model).")
    add_server_args(server)
    AsyncEngineArgs.add_cli_args(server)
    server.set_defaults(handler=serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedllm", description="LLM inference with vLLM's API.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="Complete one prompt and print the text.")
    gen.add_argument("prompt")
    talk = commands.add_parser("chat", help="An interactive chat in the terminal.")
    talk.add_argument("--system", default=None, help="A system message.")
    for sub, handler in ((gen, generate), (talk, chat)):
        _add_sampling_args(sub)
        EngineArgs.add_cli_args(sub)
        sub.set_defaults(handler=handler, disable_log_stats=True)
    _add_serve_parser(commands)
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    args.handler(args)


if __name__ == "__main__":
    main(sys.argv[1:])
