"""Tests of the example agent-session runtimes under examples/runtimes/."""
