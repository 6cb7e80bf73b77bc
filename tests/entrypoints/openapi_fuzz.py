"""Fuzz a running server against its own OpenAPI schema with schemathesis: `python openapi_fuzz.py URL KEY`.

Run as a fresh process by test_fuzz_openapi.py: the test process has loaded C kernels built with fast-math,
which flush subnormal floats to zero, and hypothesis refuses to generate floats under that.
"""
from __future__ import annotations

import sys

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

EXAMPLES_PER_OPERATION = 15
CALL_TIMEOUT_S = 60
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def fuzz(url: str, api_key: str) -> list[str]:
    """Call every operation with generated requests; raise at the first failing one. Returns the labels."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    headers = {"Authorization": f"Bearer {api_key}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def call(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=headers, checks=CHECKS, timeout=CALL_TIMEOUT_S)

        call()
    return [operation.label for operation in operations]


if __name__ == "__main__":
    print("\n".join(fuzz(sys.argv[1], sys.argv[2])))
