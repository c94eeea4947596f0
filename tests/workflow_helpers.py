"""Read what workflow.py printed: one JSON event per line."""

import json


def events(done):
    return [json.loads(line) for line in done.stdout.splitlines()]


def names(done):
    return [e["event"] for e in events(done)]


def tickets(workflow):
    return events(workflow("tickets"))[0]["tickets"]
