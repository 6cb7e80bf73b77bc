"""What a speculative step costs by the rows it verifies, and what the ngram proposer gains at those costs, on
the `spec_decode` workload at batch 1.

    python benchmarks/spec_decode_costs.py                  # 1 to 12 rows, then the replay
    python benchmarks/spec_decode_costs.py --rows 1,2,6,7,12 --rounds 5
    python benchmarks/spec_decode_costs.py --ks 5,7,9,11    # the replay for several num_speculative_tokens

1. Step cost: one prompt of the workload decodes with proposals of a fixed length made of one repeated token,
   which the target rejects, so that each step verifies that many rows and keeps one token. Row counts take
   turns over the rounds and each keeps its least time per step; the figure is its ratio to one row's (a plain
   decoding step, measured in the same invocation).
2. Replay: plain greedy decoding's output for every prompt, then the ngram proposer (the engine's own lookup,
   with spec_decode.py's settings) run over those tokens offline: each step's proposal, the tokens greedy
   verification keeps of it, and that step's cost from (1) give each request's decode time, hence the TPOT
   speedup that spec_decode.py measures, without the noise of timing every step again; beside it, the bound
   where every step verified just the tokens it keeps; with `--ks`, for each of several k. The replay shows
   how far a proposal rule can go before anyone times it: on an AMD Zen 3 it gave 2.00x where spec_decode.py
   measured 1.90-2.00x in four invocations.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import load_workload, machine_info, run_in_child, write_result  # noqa: E402
from benchmarks.spec_decode import NGRAM_K, NGRAM_LOOKUP_MAX, NGRAM_LOOKUP_MIN, _prompts  # noqa: E402

COST_PROMPT = 3  # the workload's prompt the step costs are timed on
COST_TOKENS = 96  # tokens each timed request decodes
REJECTED_TOKEN = 17  # the repeated proposal (a rare token; a step that keeps it is counted as such)


def measure(prompts: list[str], output_len: int, rows: list[int], rounds: int) -> dict[str, Any]:
    """Plain decoding's tokens of every prompt, and the least time per step at each row count."""
    from pagedllm import LLM, SamplingParams
    from pagedllm.spec_decode import ngram

    messages = [[{"role": "user", "content": p}] for p in prompts]
    plain = LLM()
    outputs = plain.chat(messages, SamplingParams(temperature=0.0, max_tokens=output_len), use_tqdm=False)
    sequences = [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outputs]
    del plain

    proposed = {"count": 0}
    # The ngram proposer's lookup, replaced in this child process: every step proposes count tokens.
    ngram.lookup = lambda tokens, num_tokens, min_n, max_n: [REJECTED_TOKEN] * min(proposed["count"], num_tokens)
    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": max(max(rows) - 1, 1),
                                  "prompt_lookup_max": 1, "prompt_lookup_min": 1})
    params = SamplingParams(temperature=0.0, max_tokens=COST_TOKENS, ignore_eos=True)
    least: dict[int, float] = {}
    for round_ in range(rounds + 1):  # round 0 warms up (captures each size's graph) and is not counted
        for count in rows:
            proposed["count"] = count - 1
            llm.llm_engine.reset_prefix_cache()
            stats = llm.llm_engine.stats.spec_decode
            accepted_before = stats.accepted_tokens if stats is not None else 0
            output = llm.chat(messages[COST_PROMPT:COST_PROMPT + 1], params, use_tqdm=False)[0]
            stats = llm.llm_engine.stats.spec_decode
            accepted = (stats.accepted_tokens if stats is not None else 0) - accepted_before
            steps = len(output.outputs[0].token_ids) - 1 - accepted  # each step keeps its accepted tokens and one
            seconds = (output.metrics.finished_time - output.metrics.first_token_time) / steps
            if round_:
                least[count] = min(least.get(count, seconds), seconds)
    return {"sequences": sequences, "step_ms": {count: least[count] * 1000 for count in rows}}


def replay(sequences: list[tuple[list[int], list[int]]], cost: Callable[[int], float],
           lookup: Callable[[list[int], int], list[int]], num_tokens: int, oracle: bool = False) -> float:
    """Mean over requests of the decode time per token (after the first) that the proposer gives, proposing up to
    `num_tokens` a step, in units of `cost`; with `oracle`, each step verifies only the proposed tokens that it
    keeps."""
    per_request = []
    for prompt, output in sequences:
        if len(output) < 2:
            continue
        context, emitted, time = prompt + output[:1], 1, 0.0
        while emitted < len(output):
            proposal = lookup(context, num_tokens)
            kept = 0
            while kept < len(proposal) and emitted + kept < len(output) and proposal[kept] == output[emitted + kept]:
                kept += 1
            time += cost(1 + (kept if oracle else len(proposal)))
            step = min(kept + 1, len(output) - emitted)
            context += output[emitted:emitted + step]
            emitted += step
        per_request.append(time / (len(output) - 1))
    return statistics.mean(per_request)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=None,
                        help="row counts timed (default: 1 to the largest of --ks + 1, what the replay needs)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds over the row counts")
    parser.add_argument("--ks", default=str(NGRAM_K),
                        help="num_speculative_tokens values to replay (each needs the row counts up to it + 1)")
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/spec_decode_costs-<time>.json)")
    args = parser.parse_args(argv)

    from pagedllm.spec_decode.ngram import lookup

    workload = load_workload("spec_decode", args.workloads_file)
    folder = os.path.dirname(args.workloads_file or os.environ.get("PAGEDLLM_BENCH_WORKLOADS") or "") or None
    ks = [int(k) for k in args.ks.split(",")]
    rows = sorted({1, *(int(r) for r in args.rows.split(","))} if args.rows else range(1, max(ks) + 2))
    measured = run_in_child(measure, _prompts(workload["prompts_file"], folder), workload["output_len"], rows,
                            args.rounds)
    step_ms = {int(r): ms for r, ms in measured["step_ms"].items()}
    relative = {r: ms / step_ms[1] for r, ms in step_ms.items()}
    for r in rows:
        print(f"{r:3d} rows: {step_ms[r]:6.2f} ms a step, {relative[r]:.3f}x one row's", flush=True)
    result: dict[str, Any] = {"workload": "spec_decode", "machine": machine_info(), "rounds": args.rounds,
                              "step_ms": step_ms, "step_cost_vs_one_row": {r: round(v, 3) for r, v in relative.items()}}

    def ngram_lookup(tokens: list[int], k: int) -> list[int]:
        return lookup(tokens, k, NGRAM_LOOKUP_MIN, NGRAM_LOOKUP_MAX)

    result["replayed_ngram"] = []
    for k in ks:
        if not all(r in relative for r in range(1, k + 2)):
            print(f"k={k}: not replayed, it needs the row counts 1 to {k + 1}", flush=True)
            continue
        speedup = 1 / replay(measured["sequences"], relative.__getitem__, ngram_lookup, k)
        bound = 1 / replay(measured["sequences"], relative.__getitem__, ngram_lookup, k, oracle=True)
        print(f"replayed ngram (k={k}, lookup {NGRAM_LOOKUP_MIN}-{NGRAM_LOOKUP_MAX}): TPOT {speedup:.3f}x plain "
              f"decoding's; {bound:.3f}x if every step verified just the tokens it keeps", flush=True)
        result["replayed_ngram"].append({"num_speculative_tokens": k, "prompt_lookup_min": NGRAM_LOOKUP_MIN,
                                         "prompt_lookup_max": NGRAM_LOOKUP_MAX,
                                         "tpot_speedup_vs_plain": round(speedup, 3),
                                         "bound_verifying_only_kept_tokens": round(bound, 3)})
    print(f"wrote {write_result(result, args.output, 'spec_decode_costs')}")
    return result


if __name__ == "__main__":
    main()
