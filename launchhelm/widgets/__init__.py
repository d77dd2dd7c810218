"""Notebook widgets (built in a later issue)."""
