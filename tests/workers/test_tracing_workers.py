"""A worker's drained run on the trace (tracing.py): a drain, not an error. In this process: the
run span is labs/worker_run.py's run_job_thread's own, on a SqliteSaver graph (no queue needed
to drain a run)."""

import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import checkpoints
import effects
import tracing
import workflow
from labs import lab_graph, worker_run

pytestmark = pytest.mark.fast


def test_a_drained_jobs_run_span_says_drained_and_is_not_an_error(tmp_path, capsys):
    from langgraph.runtime import RunControl

    exporter = InMemorySpanExporter()
    tracing.use(exporter, "worker")
    control = RunControl()
    control.request_drain("SIGTERM")  # a deploy's SIGTERM, before the run's first step
    operation = {"thread": "t", "operation_id": "t:op", "title": "Drained"}
    db = str(tmp_path / "checkpoints.sqlite")
    try:
        with (
            checkpoints.open_checkpointer(db) as saver,
            effects.open_ledger(db) as ledger,
        ):
            client = workflow.TicketClient("http://127.0.0.1:9")  # never asked: nothing runs
            graph = lab_graph.build_lab_graph(saver)
            assert worker_run.run_job_thread(graph, client, ledger, operation, 1, control) is None
    finally:
        tracing.stop()
    [run] = [json.loads(s.to_json()) for s in exporter.get_finished_spans()]
    assert (run["name"], run["attributes"]) == ("run", {"thread": "t", "run.drained": True})
    assert [(e["name"], e["attributes"]) for e in run["events"]] == [
        ("drained", {"reason": "SIGTERM"})
    ]
    assert run["status"]["status_code"] == "UNSET"  # not ERROR
