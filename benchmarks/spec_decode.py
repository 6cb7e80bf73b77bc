"""Speculative decoding against plain float32 decoding on the `spec_decode` workload (edits that copy the prompt).

    python benchmarks/spec_decode.py                     # ngram and the int8 self-draft against plain decoding
    python benchmarks/spec_decode.py --batch1-prompts 4 --output-len 96  # a shorter run on a busy machine

One process holds the three engines (plain, ngram, int8 self-draft) and interleaves them prompt by prompt, so
that a noisy machine slows each alike: first each prompt alone (batch 1), then all prompts at once. Reported:
milliseconds per output token (the whole request's wall time over its output tokens), the ratio against
plain decoding, the acceptance rate, and whether every greedy output equals plain decoding's token for token.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import load_workload, machine_info, run_in_child, write_result  # noqa: E402

TARGETS_BATCH1 = {"ngram": 2.0, "int8_draft": 1.8}


def configs(args: argparse.Namespace) -> dict[str, Optional[dict]]:
    return {"plain": None,
            "ngram": {"method": "ngram", "num_speculative_tokens": args.ngram_k, "prompt_lookup_max": 4,
                      "prompt_lookup_min": 1},
            "int8_draft": {"method": "draft_model", "quantization": "int8", "num_speculative_tokens": args.draft_k}}


def run(prompts: list[str], output_len: int, batch1_prompts: int, speculative: dict[str, Optional[dict]]
        ) -> dict[str, Any]:
    from pagedllm import LLM, SamplingParams

    llms = {name: LLM(speculative_config=config) for name, config in speculative.items()}
    params = SamplingParams(temperature=0.0, max_tokens=output_len)
    messages = [[{"role": "user", "content": p}] for p in prompts]
    for llm in llms.values():  # warm-up: graphs captured, caches touched
        llm.chat(messages[-1:], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    result: dict[str, Any] = {}
    for phase, batches in (("batch1", [[m] for m in messages[:batch1_prompts]]), ("batch16", [messages])):
        seconds = dict.fromkeys(llms, 0.0)
        tokens: dict[str, list[list[int]]] = {name: [] for name in llms}
        before = {name: _spec_totals(llm) for name, llm in llms.items()}
        for batch in batches:
            for name, llm in llms.items():
                llm.llm_engine.reset_prefix_cache()  # each engine computes every prompt itself
                start = time.perf_counter()
                outputs = llm.chat(batch, params, use_tqdm=False)
                seconds[name] += time.perf_counter() - start
                tokens[name] += [o.outputs[0].token_ids for o in outputs]
        result[phase] = _summary(llms, seconds, tokens, before)
        print(phase, json.dumps(result[phase]), flush=True)
    return result


def _spec_totals(llm: Any) -> tuple[int, int]:
    totals = llm.llm_engine.stats.spec_decode
    return (totals.draft_tokens, totals.accepted_tokens) if totals is not None else (0, 0)


def _summary(llms: dict, seconds: dict[str, float], tokens: dict[str, list[list[int]]],
             before: dict[str, tuple[int, int]]) -> dict[str, Any]:
    summary = {}
    plain_ms = None
    for name, llm in llms.items():
        num_tokens = sum(len(t) for t in tokens[name])
        ms = seconds[name] * 1000 / num_tokens
        plain_ms = plain_ms or ms
        drafts, accepted = (now - then for now, then in zip(_spec_totals(llm), before[name]))
        summary[name] = {"seconds": round(seconds[name], 2), "output_tokens": num_tokens, "ms_per_token": round(ms, 2),
                         "speedup_vs_plain": round(plain_ms / ms, 3),
                         "acceptance_rate": round(accepted / drafts, 3) if drafts else None,
                         "greedy_identical_to_plain": tokens[name] == tokens["plain"]}
    return summary


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--batch1-prompts", type=int, default=None, help="prompts run one at a time (default: all)")
    parser.add_argument("--output-len", type=int, default=None, help="max_tokens (default: the workload's)")
    parser.add_argument("--ngram-k", type=int, default=5, help="num_speculative_tokens for ngram")
    parser.add_argument("--draft-k", type=int, default=4, help="num_speculative_tokens for the int8 self-draft")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/spec_decode-<time>.json)")
    args = parser.parse_args(argv)

    workload = load_workload("spec_decode", args.workloads_file)
    folder = os.path.dirname(args.workloads_file or os.environ.get("PAGEDLLM_BENCH_WORKLOADS") or "") or None
    prompts = _prompts(workload["prompts_file"], folder)
    speculative = configs(args)
    output_len = args.output_len or workload["output_len"]
    measured = run_in_child(run, prompts, output_len, args.batch1_prompts or len(prompts), speculative)
    for phase in ("batch1", "batch16"):
        for name, figures in measured[phase].items():
            print(f"{phase} {name}: {figures['ms_per_token']:.1f} ms/token, {figures['speedup_vs_plain']:.2f}x plain, "
                  f"acceptance {figures['acceptance_rate']}, identical greedy text: "
                  f"{figures['greedy_identical_to_plain']}", flush=True)
    result = {"workload": "spec_decode", "definition": workload, "machine": machine_info(),
              "output_len": output_len, "batch1_prompts": args.batch1_prompts or len(prompts),
              "speculative_configs": speculative, "targets_batch1_speedup": TARGETS_BATCH1, **measured}
    print(f"wrote {write_result(result, args.output, 'spec_decode')}")
    return result


def _prompts(name: str, folder: Optional[str]) -> list[str]:
    from benchmarks.common import _find_workloads

    path = os.path.join(folder or os.path.dirname(_find_workloads()), name)
    with open(path) as f:
        return json.load(f)["prompts"]


if __name__ == "__main__":
    main()
