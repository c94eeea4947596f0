"""The ledger's cost per effect, beside what it is compared with, in one run (part of make bench).

    .venv/bin/python -m tools.bench_ledger [--runs N] [--quick]

Four ways to make one keyed ticket, each N times (a new key and a new thread each time), against
one receiver process on a free loopback port, the four interleaved so a busy moment hits all alike:

    post        a bare keyed POST /tickets (workflow.TicketClient.create): the floor
    graph       workflow.py's two nodes on SqliteSaver (durability "sync"), the POST in the node,
                no ledger
    ledger      the same graph with the ledger (workflow.build_graph: TICKET.perform), the
                ledger in the checkpoints' own file, as the lab runs it
    task        LangGraph's functional API: an @entrypoint calling a @task that POSTs; the task's
                result is kept in the checkpoint (LangGraph's own answer to "do not redo it")

and, to say where the time goes, graph and ledger once more with no fsync at all (synchronous=OFF
on every connection: a diagnosis, never a setting to run with): ledger_no_fsync - graph_no_fsync is
what the ledger's statements cost, the rest of ledger - graph its two fsyncs (figures:
docs/performance.md).

Prints the median milliseconds of each, the ratio ledger / graph, the load average (uptime) before
and after, and the commits per run on each connection (SqliteSaver's, the ledger's): each is one
fsync under WAL and synchronous=FULL, so where the disk dominates, ledger / graph tends to
(graph's commits + 2) / graph's commits. The machine may be shared: compare ratios, not
absolutes. The last line is one JSON object with every figure.
Exit codes: 0 measured; 2 bad arguments; 3 the receiver did not start; 130 Ctrl-C.
"""

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import checkpoints
import effects
import workflow
from commandline import Parser
from exitcodes import EXIT_INTERRUPTED
from tools.local import ROOT, LabError, ReceiverProcess, free_port, lab_env

RUNS = 300  # per way: the N; medians over them
QUICK_RUNS = 5  # --quick: shows the script works
TITLE = "Check supplier configuration"
EXIT_OK, EXIT_NO_LAB = 0, 3


def main(argv=None):
    parser = Parser(prog="tools.bench_ledger", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help=f"per way (default: {RUNS})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs per way")
    args = parser.parse_args(argv)
    runs = QUICK_RUNS if args.quick else args.runs
    try:
        with tempfile.TemporaryDirectory(prefix="stateful-lab-bench-ledger-") as tmp:
            figures = measure_ledger(Path(tmp), runs)
    except LabError as error:
        print(f"bench_ledger: {error}", file=sys.stderr)
        return EXIT_NO_LAB
    except KeyboardInterrupt:
        print(
            "bench_ledger: stopped; the receiver and the temporary folder are gone", file=sys.stderr
        )
        return EXIT_INTERRUPTED
    print_ledger_figures(figures)
    return EXIT_OK


def measure_ledger(folder, runs):
    """Every figure: milliseconds per way (medians), the ratio, the load, commits per effect."""
    env = lab_env(folder / "data", free_port())
    server = ReceiverProcess(env, log_path=folder / "receiver.log").start()
    opened = contextlib.ExitStack()
    try:
        client = workflow.TicketClient(server.url)
        ways = {
            "post": lambda i: client.create(TITLE, f"bench:post:{i}"),
            "graph": graph_run(opened, folder / "graph.sqlite", client, ledger=False),
            "ledger": graph_run(opened, folder / "ledger.sqlite", client, ledger=True),
            "task": task_run(opened, folder / "task.sqlite", client),
            # where the time goes: both again with no fsync at all (synchronous=OFF on every
            # connection; a diagnosis, never a setting to run with)
            "graph_no_fsync": graph_run(opened, folder / "g-off.sqlite", client, False, "OFF"),
            "ledger_no_fsync": graph_run(opened, folder / "l-off.sqlite", client, True, "OFF"),
        }
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            for way in ways.values():  # warm: imports, first connections, tables
                way(-1)
        load_before = os.getloadavg()
        times = {name: [] for name in ways}
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # their events
            for i in range(runs):
                for name, way in ways.items():
                    started = time.perf_counter()
                    way(i)
                    times[name].append((time.perf_counter() - started) * 1000)
            load_after = os.getloadavg()
            commits = commits_per_run(opened, folder, client)
    finally:
        opened.close()
        server.stop()
    medians = {name: round(statistics.median(t), 2) for name, t in times.items()}
    cpu = medians["ledger_no_fsync"] - medians["graph_no_fsync"]
    where = {  # the ledger's extra milliseconds per run: its statements, and its two fsyncs
        "ledger_statements_ms": round(cpu, 2),
        "ledger_fsyncs_ms": round(medians["ledger"] - medians["graph"] - cpu, 2),
        "langgraph_fsyncs_ms": round(medians["graph"] - medians["graph_no_fsync"], 2),
    }
    return {
        "where_ms": where,
        "runs": runs,
        "median_ms": medians,
        "ledger_over_graph": round(medians["ledger"] / medians["graph"], 2),
        "task_over_graph": round(medians["task"] / medians["graph"], 2),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "commits_per_run": commits,
        "commit": git_head(),
    }


def graph_run(opened, path, client, ledger, synchronous=None):
    """One start of a new thread of workflow.py's graph; with or without TICKET.perform.
    synchronous: a PRAGMA for both connections (the diagnosis's OFF), else theirs (FULL)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    saver = opened.enter_context(SqliteSaver.from_conn_string(str(path)))
    ledger_of = opened.enter_context(effects.Ledger(path))
    if synchronous:
        saver.setup()
        saver.conn.execute(f"PRAGMA synchronous={synchronous}")
        ledger_of.db.execute(f"PRAGMA synchronous={synchronous}")
    graph = workflow.build_graph(saver) if ledger else bare_graph(saver)

    def run(i):
        thread = f"bench-{i}"
        graph.invoke(
            {"operation_id": f"bench:{path.stem}:{i}", "title": TITLE},
            checkpoints.thread_config(thread),
            durability="sync",
            context=workflow.Context(client, ledger_of),
        )

    return run


def bare_graph(saver):
    """workflow.py's graph, its effect a plain keyed POST: what the ledger is added to."""
    from langgraph.graph import END, START, StateGraph

    def create_ticket(state: workflow.State, runtime):
        answer = runtime.context.client.create(state["title"], state["key"])
        return {"ticket_id": answer["ticket_id"]}

    builder = StateGraph(workflow.State, context_schema=workflow.Context)
    builder.add_node("prepare", lambda state: {"key": state["operation_id"]})
    builder.add_node("create_ticket", create_ticket)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "create_ticket")
    builder.add_edge("create_ticket", END)
    return builder.compile(checkpointer=saver)


def task_run(opened, path, client):
    """LangGraph's @task: its result kept in the checkpoint, so a resume does not redo it."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.func import entrypoint, task

    saver = opened.enter_context(SqliteSaver.from_conn_string(str(path)))

    @task
    def create_ticket(key):
        return client.create(TITLE, key)["ticket_id"]

    @entrypoint(checkpointer=saver)
    def flow(operation):
        return {"ticket_id": create_ticket(operation).result()}

    def run(i):
        flow.invoke(f"bench:task:{i}", {"configurable": {"thread_id": f"task-{i}"}})

    return run


def commits_per_run(opened, folder, client, runs=20):
    """COMMITs per run on each connection, counted with sqlite3's trace callback: SqliteSaver's
    of the graph without the ledger and with it, and the ledger's own (one claim, one receipt).
    Under WAL and synchronous=FULL each is one fsync (FIELD-NOTES: strace), so on a machine whose
    disk dominates, ledger / graph tends to (saver + ledger) / saver."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    counted = {}
    for name, with_ledger in (("graph", False), ("ledger", True)):
        path = folder / f"count-{name}.sqlite"
        saver = opened.enter_context(SqliteSaver.from_conn_string(str(path)))
        ledger = opened.enter_context(effects.Ledger(path))
        graph = workflow.build_graph(saver) if with_ledger else bare_graph(saver)
        seen = {"saver": [], "ledger": []}

        def run(i, graph=graph, ledger=ledger, name=name):
            graph.invoke(
                {"operation_id": f"bench:count-{name}:{i}", "title": TITLE},
                checkpoints.thread_config(f"count-{i}"),
                durability="sync",
                context=workflow.Context(client, ledger),
            )

        run(-1)  # the tables made: not a run's cost
        saver.conn.set_trace_callback(seen["saver"].append)
        ledger.db.set_trace_callback(seen["ledger"].append)
        for i in range(runs):
            run(i)
        saver.conn.set_trace_callback(None)
        ledger.db.set_trace_callback(None)
        counted[name] = {
            where: sum(1 for s in statements if s.strip().upper() == "COMMIT") / runs
            for where, statements in seen.items()
        }
    return counted


def git_head():
    import subprocess

    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return done.stdout.strip() + ("+changes" if dirty else "")


def print_ledger_figures(figures):
    print("\n".join(lines(figures)))
    print(json.dumps(figures, sort_keys=True))


def lines(figures):
    """The figures as a table, for this module's report and make bench's."""
    ms, counted, where = figures["median_ms"], figures["commits_per_run"], figures["where_ms"]
    return [
        f"ledger cost per effect, {figures['runs']} runs per way, medians "
        f"(commit {figures['commit']})",
        *(f"  {name:<38}{ms[name]:>9.2f} ms" for name in ("post", "graph", "ledger", "task")),
        f"  where the ledger's {ms['ledger'] - ms['graph']:.2f} ms go: its statements "
        f"{where['ledger_statements_ms']:.2f} ms, its two fsyncs {where['ledger_fsyncs_ms']:.2f} "
        f"ms (LangGraph's own fsyncs: {where['langgraph_fsyncs_ms']:.2f} ms of the graph's)",
        f"  ledger / graph {figures['ledger_over_graph']:.2f}x, task / graph "
        f"{figures['task_over_graph']:.2f}x",
        f"  commits per run (one fsync each under WAL and synchronous=FULL): graph "
        f"{counted['graph']['saver']:g}; with the ledger {counted['ledger']['saver']:g} + "
        f"{counted['ledger']['ledger']:g} (the intent before the request, the receipt after)",
        f"  load average (1, 5, 15 min): before {figures['load_before']}, "
        f"after {figures['load_after']}",
    ]


if __name__ == "__main__":
    sys.exit(main())
