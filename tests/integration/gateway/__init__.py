"""Integration tests of the agent gateway against real components (the scripted fake model, SQLite)."""
