"""A graph that calls a model, pays through a vendor's SDK and triages through GraphQL, all on a
loopback fake (Fake, at VENDOR_URL), as real applications do:

think   POST /v1/chat/completions and /v1/embeddings (OpenAI's shapes: a body naming its
        `model`) and /v1/messages (Anthropic's, with `max_tokens`): model calls, no key
pay     the SDK's create_price: POST /v1/prices?ts=<nanoseconds> with an Idempotency-Key the
        client mints for each request (uuid4), as the vendor SDK does: a retry is a new key
triage  POST /graphql: `query Issues` (a read), then `mutation CloseIssue` (no key)

build() is think -> pay -> triage; build_thinking() is think alone.
"""

import json
import os
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class Task(TypedDict, total=False):
    thread: str
    done: bool


def think(state: Task):
    said = [{"role": "user", "content": state["thread"]}]
    post("/v1/chat/completions", {"model": "gpt-4o-mini", "messages": said})
    post("/v1/embeddings", {"model": "text-embedding-3-small", "input": state["thread"]})
    post("/v1/messages", {"model": "claude", "max_tokens": 64, "messages": []})
    return {}


class PaymentSDK:
    """A vendor client that mints a new Idempotency-Key per request (what REVIEW part C found)."""

    def create_price(self, product):
        key = str(uuid.uuid4())
        return post(f"/v1/prices?ts={time.time_ns()}", {"product": product}, key)


def pay(state: Task):
    PaymentSDK().create_price(state["thread"])
    return {}


def triage(state: Task):
    read = "query Issues($repo: String!) { issues(repo: $repo) { id } }"
    post("/graphql", {"query": read, "variables": {"repo": state["thread"]}})
    close = "mutation CloseIssue($id: ID!) { closeIssue(id: $id) { id } }"
    post("/graphql", {"query": close, "variables": {"id": state["thread"]}})
    return {"done": True}


def build(nodes=(think, pay, triage)):
    builder = StateGraph(Task)
    for node in nodes:
        builder.add_node(node)
    builder.add_edge(START, nodes[0].__name__)
    for a, b in zip(nodes, nodes[1:], strict=False):
        builder.add_edge(a.__name__, b.__name__)
    builder.add_edge(nodes[-1].__name__, END)
    return builder.compile()


def build_thinking():
    return build((think,))


def post(path, body, key=None):
    headers = {"Content-Type": "application/json"} | ({"Idempotency-Key": key} if key else {})
    data = json.dumps(body).encode()
    request = urllib.request.Request(os.environ["VENDOR_URL"] + path, data, headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


class Fake(ThreadingHTTPServer):
    """Answers every POST with a small JSON object, on a free loopback port."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"id": "obj_1", "data": {}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def agent():
    """A prebuilt agent (create_react_agent, a Send per tool call) whose one tool pays through
    the SDK: the scripted model asks for `create_price` (call id `call-create_price`)."""
    import warnings

    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    from effectdrill_graphs.apps import Scripted

    @tool
    def create_price(thread: str) -> str:
        """Create a price through the vendor's SDK."""
        return PaymentSDK().create_price(thread)["id"]

    with warnings.catch_warnings():  # deprecated in favour of langchain's create_agent
        warnings.simplefilter("ignore")
        return create_react_agent(Scripted(tool="create_price"), [create_price], version="v2")
