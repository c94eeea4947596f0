"""Read what workflow.py printed: one JSON event per line."""

from tools import local


def events(done):
    return local.events(done.stdout)


def names(done):
    return [e["event"] for e in events(done)]


def tickets(workflow):
    return events(workflow("tickets"))[0]["tickets"]
