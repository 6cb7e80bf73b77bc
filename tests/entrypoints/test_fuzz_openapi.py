"""Fuzzing the server against its own OpenAPI schema (schemathesis, a bounded number of examples per
operation): never a 5xx, never a status, content type or body the schema does not document, never a hang."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

FUZZER = Path(__file__).with_name("openapi_fuzz.py")
OPERATIONS = {"POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize", "POST /detokenize",
              "GET /v1/models", "GET /health"}


def test_no_5xx_no_schema_violation_no_hang(tiny_server):
    run = subprocess.run([sys.executable, str(FUZZER), tiny_server.url, tiny_server.api_key],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    assert OPERATIONS <= set(run.stdout.split("\n"))
    assert httpx.get(f"{tiny_server.url}/health").status_code == 200
