"""Lab 17: the retry LangGraph made for you. --retry-after-ack timeout|parse gives the effect's
node a RetryPolicy and a line after the answer that fails once in this process."""

import json
import threading

from exitcodes import emit

# --- lab 17: the retry LangGraph made for you ----------------------------------------------
#
# A node given a RetryPolicy is run again by LangGraph, in the same process, when it raises an
# exception the policy retries: no crash, no checkpoint between the attempts, and the second
# attempt starts from the node's first line, so a request the first attempt had sent goes out
# again. --retry-after-ack gives the effect's node a policy and makes the line after the answer
# (a model call that summarises the ticket, the parse of its reply) fail once in this process.
#
# Which exceptions LangGraph's default policy retries: default_retry_on in the installed
# langgraph/_internal/_retry.py (RetryPolicy.retry_on's default, langgraph/types.py). It retries
# any ConnectionError (ConnectionResetError, http.client.RemoteDisconnected, ...), httpx's
# HTTPStatusError for a 5xx, requests' HTTPError, and every exception that is not a ValueError,
# TypeError, ArithmeticError, ImportError, LookupError, NameError, SyntaxError, RuntimeError,
# ReferenceError, StopIteration, StopAsyncIteration or OSError: httpx's timeouts are retried,
# the standard library's TimeoutError (an OSError) and a JSONDecodeError (a ValueError) are not.
# tests/workflow/test_retry.py runs it on each of them.

RETRY_INTERVAL_S = 0.1  # the policy's wait before the second attempt (LangGraph's default: 0.5)


def timeout_after_ack():
    """What a model call made through httpx raises when its answer takes too long."""
    import httpx

    return httpx.ReadTimeout("The read operation timed out")


def parse_error_after_ack():
    """What json.loads raises for a reply that is not JSON (an empty one)."""
    try:
        json.loads("")
    except json.JSONDecodeError as error:
        return error
    raise AssertionError("json.loads('') parsed")  # pragma: no cover


# --retry-after-ack FAILURE -> (the exception the line raises, the policy's retry_on)
RETRY_FAILURES = {
    "timeout": (timeout_after_ack, None),  # None: LangGraph's default_retry_on retries it
    "parse": (parse_error_after_ack, json.JSONDecodeError),  # the default would not
}


def failing_once_after(node, failure):
    """The node, then a line that raises `failure`'s exception the first time it runs in this
    process, and the RetryPolicy that retries it; (node, None) when failure is None."""
    if failure is None:
        return node, None
    from langgraph.types import RetryPolicy

    make_error, retry_on = RETRY_FAILURES[failure]
    policy = RetryPolicy(initial_interval=RETRY_INTERVAL_S, jitter=False)
    if retry_on is not None:
        policy = policy._replace(retry_on=retry_on)
    failed = threading.Event()  # once per graph built: once per command

    def node_then_failing_line(state, runtime):
        result = node(state, runtime)  # the request went out and its answer came back
        if not failed.is_set():
            failed.set()
            error = make_error()
            emit("after_ack_failed", error=f"{type(error).__name__}: {error}")
            raise error  # LangGraph's retry runs this node again, from its first line
        return result

    return node_then_failing_line, policy
