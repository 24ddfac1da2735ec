"""The whole stack of tests/integration/runs (the scripted fake model, the example pod's proxy and tool service,
and ``claw runs serve`` with the local backend on its Unix socket), reused as it is."""

from tests.integration.runs.conftest import stack

__all__ = ["stack"]
