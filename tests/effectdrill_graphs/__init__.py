"""Graphs written for tests/test_effectdrill.py, in the shapes LangGraph users write them."""
