"""AsyncLLMEngine on the real default model: concurrency, output kinds, cancellation, failure, idleness."""
from __future__ import annotations

import asyncio
import time

import pytest

from pagedllm import AsyncEngineArgs, AsyncLLMEngine, RequestOutputKind, SamplingParams
from pagedllm.engine.async_engine import AsyncEngineDeadError

PROMPT = "The three most important inventions of the twentieth century are"
NUM_BLOCKS = 256


@pytest.fixture(scope="module")
def loop():
    """One event loop for the module, so the engine's background task lives across tests."""
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="module")
def engine(loop):
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(num_gpu_blocks_override=NUM_BLOCKS))
    yield engine
    engine.shutdown_background_loop()


async def _collect(engine: AsyncLLMEngine, request_id: str, params: SamplingParams, prompt: str = PROMPT):
    return [output async for output in engine.generate(prompt, params, request_id)]


async def _wait_until_idle(engine: AsyncLLMEngine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.engine.has_unfinished_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


@pytest.mark.slow
def test_concurrent_identical_greedy_requests_agree(engine, loop):
    params = SamplingParams(temperature=0, max_tokens=24)

    async def run():
        alone = await _collect(engine, "alone", params)
        pair = await asyncio.gather(_collect(engine, "a", params), _collect(engine, "b", params))
        return alone, pair

    alone, (a, b) = loop.run_until_complete(run())
    texts = [outputs[-1].outputs[0].text for outputs in (alone, a, b)]
    tokens = [outputs[-1].outputs[0].token_ids for outputs in (alone, a, b)]
    assert texts[0] and texts[0] == texts[1] == texts[2]
    assert tokens[0] == tokens[1] == tokens[2] and len(tokens[0]) == 24
    assert all(outputs[-1].finished for outputs in (alone, a, b))


@pytest.mark.slow
def test_output_kinds_agree(engine, loop):
    def params(kind: RequestOutputKind) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=20, output_kind=kind)

    async def run():
        return await asyncio.gather(*(_collect(engine, f"kind-{kind.name}", params(kind))
                                      for kind in RequestOutputKind))

    cumulative, delta, final = loop.run_until_complete(run())
    assert len(final) == 1 and final[0].finished
    assert len(delta) > 1 and len(cumulative) == len(delta)
    full = cumulative[-1].outputs[0]
    assert "".join(o.outputs[0].text for o in delta) == full.text == final[0].outputs[0].text
    assert [t for o in delta for t in o.outputs[0].token_ids] == full.token_ids == final[0].outputs[0].token_ids
    # Prompt data only in the first DELTA output.
    assert delta[0].prompt_token_ids and all(o.prompt_token_ids is None for o in delta[1:])


@pytest.mark.slow
def test_cancelling_the_consumer_aborts_and_frees_blocks(engine, loop):
    kv_cache = engine.engine.scheduler.kv_cache
    seen = []

    async def consume():
        params = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
        async for output in engine.generate(PROMPT, params, "to-cancel"):
            seen.append(len(output.outputs[0].token_ids))

    async def run():
        task = asyncio.ensure_future(consume())
        while len(seen) < 3:
            await asyncio.sleep(0.005)
        assert kv_cache.num_free_blocks < NUM_BLOCKS
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_until_idle(engine)

    loop.run_until_complete(run())
    assert not engine.engine.has_unfinished_requests()
    assert kv_cache.num_free_blocks == NUM_BLOCKS
    assert seen[-1] < 500 and engine.is_running and not engine.errored


@pytest.mark.slow
def test_abort_ends_the_stream_with_cancelled_error(engine, loop):
    async def run():
        stream = engine.generate(PROMPT, SamplingParams(max_tokens=500, ignore_eos=True), "to-abort")
        first = await stream.__anext__()
        await engine.abort("to-abort")
        with pytest.raises(asyncio.CancelledError):
            async for _ in stream:
                pass
        return first

    first = loop.run_until_complete(run())
    assert not first.finished
    assert engine.engine.scheduler.kv_cache.num_free_blocks == NUM_BLOCKS


@pytest.mark.slow
def test_bad_request_fails_alone(engine, loop):
    async def run():
        with pytest.raises(ValueError, match="out of vocabulary"):
            await _collect(engine, "bad", SamplingParams(), prompt={"prompt_token_ids": [10**9]})
        return await _collect(engine, "good", SamplingParams(temperature=0, max_tokens=4))

    outputs = loop.run_until_complete(run())
    assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 4


@pytest.mark.slow
def test_idle_loop_does_not_spin(engine, loop):
    async def run():
        await _collect(engine, "before-idle", SamplingParams(max_tokens=2))
        await asyncio.sleep(0.05)
        start = time.process_time()
        await asyncio.sleep(0.5)
        return time.process_time() - start

    cpu_seconds = loop.run_until_complete(run())
    assert engine.is_running
    assert cpu_seconds < 0.05


def test_failure_in_the_loop_fails_requests_and_marks_engine_dead(tiny_model_dir):
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=tiny_model_dir, num_gpu_blocks_override=32))
    executor = engine.engine.model_executor
    real_execute = executor.execute_model
    calls = []

    def failing_execute(scheduler_output):
        calls.append(1)
        if len(calls) > 2:  # inject a worker failure on the third step
            raise RuntimeError("worker lost")
        return real_execute(scheduler_output)

    executor.execute_model = failing_execute

    async def run():
        params = SamplingParams(max_tokens=50, ignore_eos=True)
        results = await asyncio.gather(_collect(engine, "x", params), _collect(engine, "y", params),
                                       return_exceptions=True)
        with pytest.raises(AsyncEngineDeadError):
            await engine.check_health()
        with pytest.raises(AsyncEngineDeadError):
            await _collect(engine, "z", params)
        return results

    results = asyncio.run(run())
    assert all(isinstance(r, AsyncEngineDeadError) and "worker lost" in str(r) for r in results)
    assert engine.errored and not engine.is_running


@pytest.mark.slow
def test_a_request_failing_in_its_batch_ends_its_stream_with_an_error_and_the_engine_goes_on(engine, loop):
    from pagedllm.engine.async_engine import RequestFailedError

    good = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    bad = SamplingParams(temperature=0, max_tokens=12, logits_processors=[lambda ids, logits: logits / 0 * 0])

    async def run():
        alone = await _collect(engine, "iso-alone", good)
        results = await asyncio.gather(_collect(engine, "iso-good", good), _collect(engine, "iso-bad", bad),
                                       return_exceptions=True)
        after = await _collect(engine, "iso-after", good)
        return alone, results, after

    alone, (together, failed), after = loop.run_until_complete(run())
    assert isinstance(failed, RequestFailedError) and "NaN" in str(failed)
    assert together[-1].outputs[0].token_ids == alone[-1].outputs[0].token_ids == after[-1].outputs[0].token_ids
    assert engine.is_running and not engine.errored
