"""What the drill reads from a user's graph before running it: its runnables, whether a node is
async only, whether a node uses a store."""


def uses_store(graph):
    """Whether a node of the graph (or a subgraph's) takes a `store` argument or calls
    get_store(): LangGraph injects the graph's store into either (None without one)."""
    import inspect

    for runnable in runnables(graph):
        for function in (getattr(runnable, "func", None), getattr(runnable, "afunc", None)):
            if function is None:
                continue
            try:
                if "store" in inspect.signature(function).parameters:
                    return True
                if "get_store" in inspect.getsource(function):
                    return True
            except (TypeError, ValueError, OSError):
                continue
    return False


def runnables(graph):
    """Every runnable a graph runs, its subgraphs' and sequences' steps included, once each."""
    from langgraph.pregel import Pregel

    pending, seen = [graph], set()
    while pending:
        runnable = pending.pop()
        if id(runnable) in seen:
            continue
        seen.add(id(runnable))
        if isinstance(runnable, Pregel):
            pending += [node.bound for node in runnable.nodes.values()]
            continue
        yield runnable
        pending += [s for s in getattr(runnable, "steps", ()) if s is not None]


def needs_async(graph):
    """Whether a node (or a subgraph's) is `async def` only: LangGraph's RunnableCallable
    then has no func, and invoke() raises 'No synchronous function provided'."""
    return any(
        hasattr(runnable, "afunc") and getattr(runnable, "func", True) is None
        for runnable in runnables(graph)
    )
