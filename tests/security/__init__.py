"""Hostile cases gathered in one place, so that they run together (``pytest tests/security``): what an untrusted
worker, model, plugin or network client may try against the stack's inner walls, each with its positive control."""
