"""Graphs written for tests/effectdrill/test_effectdrill.py, in the shapes LangGraph users
write them."""
