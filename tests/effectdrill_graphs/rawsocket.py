"""One node that sends POST /tickets to the receiver through a socket of its own: a client the
HTTP observer does not see, as gRPC or a database driver are not seen."""

import json
import os
import socket
from typing import TypedDict
from urllib.parse import urlsplit

from langgraph.graph import END, START, StateGraph


class Order(TypedDict, total=False):
    order: str
    booked: bool


def book(state: Order):
    url = urlsplit(os.environ["API_URL"])
    body = json.dumps({"title": state["order"]}).encode()
    head = (
        f"POST /tickets HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=10) as conn:
        conn.sendall(head.encode() + body)
        status = conn.makefile("rb").readline().split()[1]
    return {"booked": status in (b"200", b"201")}


def build():
    builder = StateGraph(Order)
    builder.add_node(book)
    builder.add_edge(START, "book")
    builder.add_edge("book", END)
    return builder.compile()
