"""A hundred-odd requests of the soak benchmark's mix through the shared tiny-model server: every one ends
as intended, afterwards nothing runs or waits and the KV cache is empty again, and neither process's resident
memory grew by 5% after the warm-up."""
from __future__ import annotations

import asyncio

import pytest

from benchmarks.soak import engine_pid, soak

pytestmark = pytest.mark.slow

NUM_REQUESTS = 120
WARMUP = 40


def test_soak_mix_leaves_nothing_behind(tiny_server):
    pids = {"server": tiny_server.process.pid, "engine": engine_pid(tiny_server.log_path)}
    result = asyncio.run(soak(tiny_server.url, NUM_REQUESTS, concurrency=12, seed=0, max_tokens=12,
                              api_key=tiny_server.api_key, pids=pids, warmup=WARMUP))
    assert result["errors"] == {}, result["error_examples"]
    assert sum(result["outcomes"].values()) == NUM_REQUESTS
    assert result["outcomes"]["completed"] > NUM_REQUESTS // 2
    assert result["outcomes"]["dropped by client"] > 0 and result["outcomes"]["client timeout"] > 0
    assert result["metrics_after"] == {"num_requests_running": 0, "num_requests_waiting": 0,
                                       "num_requests_swapped": 0, "gpu_cache_usage_perc": 0}
    assert set(result["rss_growth_after_warmup_pct"]) == {"server", "engine"}
    assert all(growth < 5 for growth in result["rss_growth_after_warmup_pct"].values()), result["rss_mib"]
    assert "Traceback" not in tiny_server.log()
