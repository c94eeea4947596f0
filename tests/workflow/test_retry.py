"""Lab 17's claims about LangGraph's RetryPolicy, run on the installed LangGraph.

The guide and labs/cli.py's lab 17 section say which exceptions the default policy retries
(default_retry_on, langgraph/_internal/_retry.py), that a retried node runs again from its
first line in the same process, and that no checkpoint is saved between the attempts. Each test
here runs the installed code: the function itself, then a real graph whose node raises once,
then labs/cli.py's switch against a real receiver, in this process. The guide's own commands are
run by tests/guides (`-k 17`) in both backends.
"""

import http.client
import json
import logging
import socket
import urllib.error
import urllib.request

import httpx
import pytest
import requests
from langgraph._internal._retry import default_retry_on
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy
from typing_extensions import TypedDict
from workflow_helpers import names
from workflow_helpers import tickets as helpers_tickets

from labs import retries as retries_lesson

pytestmark = pytest.mark.fast


def httpx_status(code):
    request = httpx.Request("POST", "http://127.0.0.1/tickets")
    return httpx.HTTPStatusError("status", request=request, response=httpx.Response(code))


def requests_status(code):
    response = requests.Response()
    response.status_code = code
    return requests.HTTPError("status", response=response)


def parse_error():
    return retries_lesson.parse_error_after_ack()


RETRIED = {  # what the guide says the default policy retries
    "ConnectionResetError": ConnectionResetError,
    "RemoteDisconnected": lambda: http.client.RemoteDisconnected("closed"),
    "BrokenPipeError": BrokenPipeError,
    "httpx.ReadTimeout": retries_lesson.timeout_after_ack,
    "httpx.ConnectError": lambda: httpx.ConnectError("refused"),
    "httpx 503": lambda: httpx_status(503),
    "requests HTTPError 503": lambda: requests_status(503),
    # a requests Response is false for a 4xx (Response.__bool__ is .ok), so default_retry_on's
    # `if exc.response` takes its else: True. The guide says "requests' HTTPError", any status.
    "requests HTTPError 404": lambda: requests_status(404),
    "http.client.IncompleteRead": lambda: http.client.IncompleteRead(b""),
    "Exception": lambda: Exception("anything not on its list"),
}
NOT_RETRIED = {  # and what it does not
    "TimeoutError": TimeoutError,
    "socket.timeout": socket.timeout,
    "OSError": OSError,
    "urllib URLError": lambda: urllib.error.URLError("timed out"),
    "urllib HTTPError 503": lambda: urllib.error.HTTPError("http://x", 503, "busy", {}, None),
    "requests.Timeout": requests.Timeout,  # requests' own exceptions are OSErrors
    "requests.ConnectionError": requests.ConnectionError,
    "JSONDecodeError": parse_error,
    "ValueError": ValueError,
    "KeyError": KeyError,
    "RuntimeError": RuntimeError,
    "httpx 404": lambda: httpx_status(404),
}


def test_the_default_policy_is_default_retry_on_in_langgraph_internal_retry():
    assert RetryPolicy().retry_on is default_retry_on
    assert default_retry_on.__module__ == "langgraph._internal._retry"
    default = RetryPolicy()
    assert (default.max_attempts, default.initial_interval, default.backoff_factor) == (3, 0.5, 2)
    assert default.jitter is True


def test_what_the_guide_calls_a_value_error_and_an_os_error_is_one():
    assert issubclass(json.JSONDecodeError, ValueError) and socket.timeout is TimeoutError
    for kind in (TimeoutError, urllib.error.URLError, requests.Timeout, requests.ConnectionError):
        assert issubclass(kind, OSError), kind
    assert not issubclass(requests.ConnectionError, ConnectionError)  # not the built-in one
    assert issubclass(http.client.RemoteDisconnected, ConnectionResetError)


@pytest.mark.parametrize("name", RETRIED)
def test_default_retry_on_retries(name):
    assert default_retry_on(RETRIED[name]()) is True


@pytest.mark.parametrize("name", NOT_RETRIED)
def test_default_retry_on_does_not_retry(name):
    assert default_retry_on(NOT_RETRIED[name]()) is False


class Count(TypedDict, total=False):
    done: bool


def failing_once_graph(make_error, policy):
    """A node that records each attempt and raises make_error() on its first (None: never),
    under policy; compiled with an InMemorySaver. -> (graph, attempts)"""
    attempts = []

    def node(state: Count):
        attempts.append(len(attempts) + 1)
        if make_error is not None and len(attempts) == 1:
            raise make_error()
        return {"done": True}

    builder = StateGraph(Count)
    builder.add_node("effect", node, retry_policy=policy)
    builder.add_edge(START, "effect")
    builder.add_edge("effect", END)
    return builder.compile(checkpointer=InMemorySaver()), attempts


FAST = RetryPolicy(initial_interval=0.01, jitter=False)  # the default retry_on, short waits


@pytest.mark.parametrize(
    "name, retried",
    [("httpx.ReadTimeout", True), ("ConnectionResetError", True)]
    + [("TimeoutError", False), ("JSONDecodeError", False), ("requests.Timeout", False)],
)
def test_a_graph_under_the_default_policy_runs_the_node_again_in_the_same_invoke(name, retried):
    graph, attempts = failing_once_graph({**RETRIED, **NOT_RETRIED}[name], FAST)
    config = {"configurable": {"thread_id": "t"}}
    if retried:
        assert graph.invoke({}, config) == {"done": True}
        assert attempts == [1, 2]
    else:
        with pytest.raises(Exception) as raised:
            graph.invoke({}, config)
        assert default_retry_on(raised.value) is False and attempts == [1]


def test_no_checkpoint_is_saved_between_the_attempts():
    """The retry happens inside one step: the thread's history after a run whose node failed
    once and was retried has the same checkpoints as that of a run that never failed."""
    config = {"configurable": {"thread_id": "t"}}
    retried, attempts = failing_once_graph(retries_lesson.timeout_after_ack, FAST)
    retried.invoke({}, config)
    never_failed, once = failing_once_graph(None, FAST)
    never_failed.invoke({}, config)
    assert attempts == [1, 2] and once == [1]

    def steps(graph):
        return [(c.metadata["step"], c.metadata["source"]) for c in graph.get_state_history(config)]

    assert steps(retried) == steps(never_failed) == [(1, "loop"), (0, "loop"), (-1, "input")]


@pytest.mark.parametrize("failure", retries_lesson.RETRY_FAILURES)
def test_lab_17s_policies_retry_their_failure_and_the_default_would_not_retry_parse(failure):
    """labs/cli.py --retry-after-ack FAILURE: the node's policy retries the exception its line
    raises. `parse` names json.JSONDecodeError: under the default policy it would fail the run."""
    make_error, retry_on = retries_lesson.RETRY_FAILURES[failure]
    _, policy = retries_lesson.failing_once_after(lambda state, runtime: {}, failure)
    graph, attempts = failing_once_graph(make_error, policy)
    assert graph.invoke({}, {"configurable": {"thread_id": "t"}}) == {"done": True}
    assert attempts == [1, 2]
    assert default_retry_on(make_error()) is (retry_on is None)


def test_a_node_without_a_policy_is_not_retried():
    graph, attempts = failing_once_graph(ConnectionResetError, None)
    with pytest.raises(ConnectionResetError):
        graph.invoke({}, {"configurable": {"thread_id": "t"}})
    assert attempts == [1]


def test_max_attempts_counts_the_first_attempt():
    attempts = []

    def node(state: Count):
        attempts.append(len(attempts) + 1)
        raise ConnectionResetError("every time")

    builder = StateGraph(Count)
    builder.add_node("effect", node, retry_policy=FAST)
    builder.add_edge(START, "effect")
    with pytest.raises(ConnectionResetError):
        builder.compile().invoke({})
    assert attempts == [1, 2, 3] and FAST.max_attempts == 3


def test_the_retry_leaves_an_info_record_and_nothing_louder(caplog):
    graph, attempts = failing_once_graph(retries_lesson.timeout_after_ack, FAST)
    with caplog.at_level(logging.DEBUG, logger="langgraph"):
        graph.invoke({}, {"configurable": {"thread_id": "t"}})
    retried = [r for r in caplog.records if r.getMessage().startswith("Retrying task effect")]
    assert [(r.name, r.levelno) for r in retried] == [("langgraph.pregel._retry", logging.INFO)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert attempts == [1, 2]


@pytest.mark.parametrize(
    "mode, tickets, posts, second",
    [
        ("naive", 2, 2, "effect_ack"),
        ("safe", 1, 2, "effect_ack"),
        ("ledger", 1, 1, "effect_receipt"),
    ],
)
def test_lab_17_one_start_no_stderr_and_the_receivers_count(
    mode, tickets, posts, second, receiver, workflow
):
    """labs/cli.py start --retry-after-ack timeout, in this process: exit 0 and nothing on stderr
    (no LangGraph line either), the request sent again by naive and safe, not by the ledger."""
    done = workflow(
        "start",
        "--thread",
        mode,
        "--operation",
        f"case-017-{mode}",
        "--mode",
        mode,
        "--retry-after-ack",
        "timeout",
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert names(done) == ["prepare", "effect_ack", "after_ack_failed", second, "done"]
    assert len(helpers_tickets(workflow)) == tickets
    assert receiver_counts(receiver.url) == {"created": tickets, "replayed": posts - tickets}


def receiver_counts(url):
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        families = {f.name: f for f in text_string_to_metric_families(answer.read().decode())}
    (created,) = families["receiver_tickets_created"].samples
    (replayed,) = families["receiver_idempotent_replays"].samples
    return {"created": created.value, "replayed": replayed.value}
