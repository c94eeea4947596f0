"""effectdrill: kill a LangGraph graph at every saver call and report the effects that repeated.

A crashed LangGraph run resumes from its last checkpoint and runs the node in flight again, so
an effect that node already sent (a charge, an email, a row) happens twice unless it carries a
stable idempotency key that the receiving service honours. The drill finds where: it kills a
forked run with SIGKILL just before each distinct saver call of a clean run, resumes it from a
fresh saver on the same database, and compares the effects your observer counts with the clean
run's (the baseline).

    report = effectdrill.drill(graph, {"order": "{thread}"}, observe)
    report.assert_clean()  # or: effectdrill MODULE:GRAPH --input ... --observe ...

It also records the HTTP requests each run sends (outbound.py), and `python -m effectdrill
replay` resumes a copy of real checkpoints under the graph as it is now (replay.py).

Checked on LangGraph 1.2.24 (the saver calls, the durability modes, get_state().tasks), its
rows on 1.0.1 too. POSIX only (fork, SIGKILL). Dependencies: langgraph (the graphs it drills,
Command, Pregel.copy) and langgraph-checkpoint-sqlite (the default saver, a SQLite file: it
survives a kill); the `postgres` extra adds langgraph-checkpoint-postgres and psycopg for a
postgresql:// database.
"""

from effectdrill.api import DURABILITIES, drill
from effectdrill.errors import DrillError
from effectdrill.report import Report, Row, Run
from effectdrill.world import SqliteWorld

__all__ = ["DURABILITIES", "DrillError", "Report", "Row", "Run", "SqliteWorld", "drill"]
