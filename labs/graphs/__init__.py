"""Graphs for the drill: small examples for lab 11, and lab 13's saga (saga.py, from
labs/cli.py)."""
