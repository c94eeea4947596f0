"""A graph whose effects are HTTP requests to the receiver (api.py at API_URL), each node's sent
by another client, and an observer that counts only some of them.

book -> notify -> remind, each a POST /tickets:
    book    urllib (http.client), keyed on the thread: a resend gets the same ticket
    notify  requests (urllib3, http.client), no key: every send is a new ticket
    remind  httpx, a fresh uuid4 key each time (lab 05's trap): every send is a new ticket
observe_booked(thread) counts the booked ticket only: the notices and reminders it never sees.
"""

import json
import os
import urllib.request
import uuid
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

KEYS = {"book": "thread", "notify": None, "remind": "fresh"}  # node -> the key it sends
CLIENTS = {"book": "urllib", "notify": "requests", "remind": "httpx"}  # node -> its client


class Trip(TypedDict, total=False):
    trip: str
    booked: int
    notified: int
    reminded: int


def book(state: Trip):
    return {"booked": post("urllib", state["trip"], state["trip"])}


def notify(state: Trip):
    return {"notified": post("requests", f"{state['trip']}/notice", None)}


def remind(state: Trip):
    return {"reminded": post("httpx", f"{state['trip']}/reminder", str(uuid.uuid4()))}


def build():
    builder = StateGraph(Trip)
    for node in (book, notify, remind):
        builder.add_node(node)
    builder.add_edge(START, "book")
    builder.add_edge("book", "notify")
    builder.add_edge("notify", "remind")
    builder.add_edge("remind", END)
    return builder.compile()


def observe_booked(thread):
    """The booked ticket of this trip, and nothing else: an observer that misses effects."""
    return {"booked": sum(t["payload"]["title"] == thread for t in tickets())}


def observe_all(thread):
    """Every ticket of this trip, by title (the trip's own, its notices and reminders)."""
    titles = [t["payload"]["title"] for t in tickets()]
    return {
        "booked": titles.count(thread),
        "notices": titles.count(f"{thread}/notice"),
        "reminders": titles.count(f"{thread}/reminder"),
    }


# helpers


def post(client, title, key):
    url = os.environ["API_URL"] + "/tickets"
    headers = {"Content-Type": "application/json"} | ({"Idempotency-Key": key} if key else {})
    if client == "requests":
        import requests

        answer = requests.post(url, json={"title": title}, headers=headers, timeout=10)
        answer.raise_for_status()
        return answer.json()["ticket_id"]
    if client == "httpx":
        import httpx

        answer = httpx.post(url, json={"title": title}, headers=headers, timeout=10)
        answer.raise_for_status()
        return answer.json()["ticket_id"]
    body = json.dumps({"title": title}).encode()
    request = urllib.request.Request(url, body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["ticket_id"]


def tickets():
    with urllib.request.urlopen(os.environ["API_URL"] + "/tickets", timeout=10) as answer:
        return json.load(answer)["tickets"]
