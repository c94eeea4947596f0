"""What the drill reads from a user's graph before running it: its runnables, whether a node is
async only, whether a node uses a store.

Every read goes through probe(): a user's object may raise anything from an attribute
(LangChain's RunnableWithFallbacks answers an unknown attribute through `__getattr__`, which
reads the wrapped runnable's type hints: on `ToolNode(...).with_fallbacks(...)` that raises
NameError for a name ToolNode imports only for type checkers). A probe that raises tells the
drill nothing, and the drill goes on with what the clean run shows.
"""

import inspect

MISSING = object()  # probe(): the attribute could not be read


def probe(thing, name, default=None):
    """getattr(thing, name, default), whatever the object raises (default then)."""
    try:
        return getattr(thing, name, default)
    except Exception:
        return default


def uses_store(graph):
    """Whether a node of the graph (or a subgraph's) takes a `store` argument or calls
    get_store(): LangGraph injects the graph's store into either (None without one)."""
    for runnable in runnables(graph):
        for function in (probe(runnable, "func"), probe(runnable, "afunc")):
            if function is None:
                continue
            try:
                if "store" in inspect.signature(function).parameters:
                    return True
                if "get_store" in inspect.getsource(function):
                    return True
            except Exception:  # no signature, no source, or a callable that raises: not known
                continue
    return False


def runnables(graph):
    """Every runnable a graph runs, its subgraphs', sequences' steps, bindings' and fallbacks'
    included, once each."""
    from langgraph.pregel import Pregel

    pending, seen = [graph], set()
    while pending:
        runnable = pending.pop()
        if runnable is None or id(runnable) in seen:
            continue
        seen.add(id(runnable))
        if isinstance(runnable, Pregel):
            nodes = probe(runnable, "nodes", {})
            pending += [probe(node, "bound") for node in values(nodes)]
            continue
        yield runnable
        pending += listed(probe(runnable, "steps", ()))  # RunnableSequence, RunnableSeq
        pending += [probe(runnable, "bound"), probe(runnable, "runnable")]  # a binding, fallbacks
        pending += listed(probe(runnable, "fallbacks", ()))


def needs_async(graph):
    """Whether a node (or a subgraph's) is `async def` only: LangGraph's RunnableCallable
    then has no func, and invoke() raises 'No synchronous function provided'."""
    return any(
        probe(runnable, "afunc", MISSING) is not MISSING and probe(runnable, "func", True) is None
        for runnable in runnables(graph)
    )


def values(mapping):
    try:
        return list(mapping.values())
    except Exception:
        return []


def listed(things):
    try:
        return [thing for thing in things if thing is not None]
    except Exception:
        return []
