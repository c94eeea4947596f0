"""The key on the trace (tracing.py): a crash-and-resume's spans join on the idempotency key.

The first attempt is a real process, really killed; the receiver is a real process. Their spans
reach the test through the SDK's file exporter (TRACE=PATH, a JSON line per span as it ends);
the resume runs in this process, its spans in the SDK's InMemorySpanExporter.
"""

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import exitcodes
import tracing
import workflow
from labs import cli as lab_py  # `lab` is the fixture: the lab's environment
from tools.local import ROOT, ReceiverProcess, run_command

KEY = tracing.KEY
OPERATION = "case-trace:open-ticket:v1"


@pytest.fixture
def traced_receiver(lab, tmp_path):
    """labs/receiver.py with TRACE: its spans in receiver-spans.jsonl."""
    spans = tmp_path / "receiver-spans.jsonl"
    server = ReceiverProcess({**lab, "TRACE": str(spans)}, tmp_path / "receiver.log").start()
    yield spans
    server.stop()


@pytest.fixture
def memory():
    """Tracing on in this process, into the SDK's in-memory exporter; off again afterwards."""
    exporter = InMemorySpanExporter()
    tracing.use(exporter, "workflow")
    yield exporter
    tracing.stop()


def read(path):
    """The spans a process exported to path, as the SDK writes them (ReadableSpan.to_json)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def exported(exporter):
    """The in-memory spans, in the same shape as the file's."""
    return [json.loads(span.to_json()) for span in exporter.get_finished_spans()]


def keyed(spans, name):
    return [s for s in spans if s["name"] == name and s["attributes"].get(KEY) == OPERATION]


def parent_of(span, spans):
    return next(s for s in spans if s["context"]["span_id"] == span["parent_id"])


def test_a_resumed_runs_two_attempts_and_the_receivers_replay_join_on_the_key(
    lab, traced_receiver, memory, tmp_path, capsys
):
    """Key only (--mode safe, labs 01-14): killed after the answer, the resume sends again, and
    the receiver answers with its first ticket. Each attempt is a trace of its own; the key is
    what joins them, and the receiver's span says which answer was a replay."""
    first_spans = tmp_path / "first-attempt.jsonl"
    start = ["start", "--thread", "t", "--operation", OPERATION, "--mode", "safe", "--crash"]
    killed = run_command([sys.executable, "-m", "labs", *start], {**lab, "TRACE": str(first_spans)})
    assert killed.returncode == -9, killed.stderr
    # A span is exported when it ends: the killed run's own span never did; its POST had.
    assert [s["name"] for s in read(first_spans)] == ["POST /tickets"]
    assert lab_py.main(["resume", "--thread", "t"], lab) == 0
    assert '"created": false' in capsys.readouterr().out  # the replay, as the learner sees it
    first, resumed = (
        keyed(read(first_spans), "POST /tickets"),
        keyed(exported(memory), "POST /tickets"),
    )
    assert len(first) == len(resumed) == 1  # one request per attempt
    for sent in (*first, *resumed):  # made in the node: its thread and node join the attempts
        assert (sent["attributes"]["thread"], sent["attributes"]["langgraph.node"]) == (
            "t",
            "create_ticket",
        )
    assert first[0]["context"]["trace_id"] != resumed[0]["context"]["trace_id"]
    received = keyed(read(traced_receiver), "POST /tickets")
    assert len(received) == 2
    for sent, answered in zip([*first, *resumed], received, strict=True):
        assert answered["kind"] == "SpanKind.SERVER" and sent["kind"] == "SpanKind.CLIENT"
        assert answered["context"]["trace_id"] == sent["context"]["trace_id"]  # traceparent
        assert answered["parent_id"] == sent["context"]["span_id"]
    assert [s["name"] for s in exported(memory)][-1] == "run"  # the resume ended its own
    assert not any("langgraph.node" in s["attributes"] for s in received)  # in no node
    made, replayed = received
    assert made["attributes"]["receiver.replay"] is False
    assert replayed["attributes"]["receiver.replay"] is True
    assert made["attributes"]["ticket.id"] == replayed["attributes"]["ticket.id"]  # one ticket
    assert len(workflow.TicketClient(lab["API_URL"]).tickets()) == 1


def test_the_relays_redelivery_and_the_receivers_replay_join_on_the_message_id(
    lab, traced_receiver, memory, tmp_path, capsys
):
    """Lab 19's window: a relay killed between the receiver's answer and its mark (a real
    process), then the next relay (in this process) sends the message again. The two POSTs and
    the receiver's two answers, the first made and the second a replay, carry the message id."""
    from labs import relay

    message = "case-trace:outbox"
    Path(lab["CHECKPOINT_DB"]).parent.mkdir(parents=True)
    with relay.open_outbox(lab["CHECKPOINT_DB"]) as outbox:
        outbox.put(message, "/tickets", {"title": "Trace"})
    first_spans = tmp_path / "first-relay.jsonl"
    killed = run_command(
        [sys.executable, "-m", "labs.relay", "--once", "--crash-at", "after-publish"],
        {**lab, "TRACE": str(first_spans)},
    )
    assert killed.returncode == -9, killed.stderr
    assert relay.main(["--once"], lab) == 0
    assert '"created": false' in capsys.readouterr().out
    sent = [
        s
        for s in [*read(first_spans), *exported(memory)]
        if s["name"] == "POST /tickets" and s["attributes"].get(KEY) == message
    ]
    received = [s for s in read(traced_receiver) if s["attributes"].get(KEY) == message]
    assert len(sent) == len(received) == 2  # one per delivery, each answered
    for request, answered in zip(sent, received, strict=True):
        assert answered["parent_id"] == request["context"]["span_id"]  # traceparent
    assert [s["attributes"]["receiver.replay"] for s in received] == [False, True]
    assert len(workflow.TicketClient(lab["API_URL"]).tickets()) == 1


@pytest.mark.fast
def test_an_earlier_attempts_ticket_is_adopted_by_key_and_the_span_says_so(lab, receiver, memory):
    """What a kill between the answer and the receipt (after-send) leaves: the ledger's row
    requested, the receiver's ticket. The next attempt asks by key (GET ?key=) and adopts it."""
    Path(lab["CHECKPOINT_DB"]).parent.mkdir(parents=True)
    client = workflow.TicketClient(lab["API_URL"])
    with workflow.effects.open_ledger(lab["CHECKPOINT_DB"]) as ledger:
        ledger.claim(OPERATION, "ticket", {"title": "Trace"})  # the earlier attempt's intent
        client.create("Trace", key=OPERATION)  # and its request, which took effect
        memory.clear()
        workflow.ticket.perform(ledger, OPERATION, {"title": "Trace"}, client)
    spans = exported(memory)
    [effect] = keyed(spans, "effect ticket")
    assert effect["attributes"]["effect.how"] == "adopted"
    assert effect["attributes"]["effect.state"] == "confirmed"
    assert effect["status"]["status_code"] == "UNSET"
    [lookup] = keyed(spans, "GET /tickets")  # what it sent instead of a second POST
    assert parent_of(lookup, spans) == effect
    assert keyed(spans, "POST /tickets") == []


@pytest.mark.fast
def test_a_receipt_is_on_the_span_as_the_ledgers_answer_without_a_request(
    lab, receiver, memory, capsys
):
    """Started, then run again by key: the second effect span says receipt and sends nothing."""
    Path(lab["CHECKPOINT_DB"]).parent.mkdir(parents=True)
    with workflow.effects.open_ledger(lab["CHECKPOINT_DB"]) as ledger:
        client = workflow.TicketClient(lab["API_URL"])
        for _ in range(2):
            workflow.ticket.perform(ledger, OPERATION, {"title": "Trace"}, client)
    spans = exported(memory)
    assert [s["attributes"]["effect.how"] for s in keyed(spans, "effect ticket")] == [
        "sent",
        "receipt",
    ]
    assert {s["attributes"]["effect.state"] for s in keyed(spans, "effect ticket")} == {"confirmed"}
    assert len(keyed(spans, "POST /tickets")) == 1  # the receipt sent nothing


@pytest.mark.fast
def test_a_drained_run_ends_its_span_with_a_drain_not_an_error(lab, receiver, memory, capsys):
    """SIGTERM (a deploy) drains the run at its next step boundary: exit 75, and the run's span
    says drained, with its status left unset, not ERROR."""
    env = {**lab, "FAILPOINTS": "after-prepare=term"}
    assert workflow.main(["start", "--thread", "t"], env) == exitcodes.EXIT_DRAINED
    [run_span] = [s for s in exported(memory) if s["name"] == "run"]
    assert run_span["attributes"]["run.drained"] is True
    assert [e["name"] for e in run_span["events"]] == ["drained"]
    assert run_span["status"]["status_code"] == "UNSET"


BLOCKED = "import sys; sys.modules['opentelemetry'] = None  # any OpenTelemetry import fails\n"
API = """sys.path.insert(0, ""); sys.argv = ["labs/receiver.py"]
import runpy; runpy.run_path("labs/receiver.py", run_name="__main__")
"""
LEDGER = """import effects, workflow
client = workflow.TicketClient(sys.argv[1])
with effects.open_ledger(sys.argv[2]) as ledger:
    print(workflow.ticket.perform(ledger, "k", {"title": "t"}, client).how)
print(client.create("t", "k")["created"])
print([m for m, module in sys.modules.items() if m.startswith("opentelemetry") and module])
"""


def test_tracing_off_the_receiver_and_the_ledger_need_only_the_standard_library(lab, tmp_path):
    """With OpenTelemetry made unimportable, labs/receiver.py serves a keyed POST and its replay,
    and the ledger performs an effect; with TRACE set the receiver refuses to start, in one line."""
    api = tmp_path / "api_without_opentelemetry.py"
    api.write_text(BLOCKED + API)
    server = ReceiverProcess(lab, tmp_path / "receiver.log", script=api).start()
    try:
        Path(lab["CHECKPOINT_DB"]).parent.mkdir(parents=True)
        argv = [sys.executable, "-c", BLOCKED + LEDGER, lab["API_URL"], lab["CHECKPOINT_DB"]]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.stdout.splitlines() == ["sent", "False", "[]"], done.stderr
    finally:
        server.stop()
    env = {**lab, "TRACE": str(tmp_path / "spans.jsonl")}
    refused = run_command([sys.executable, str(api)], env)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [  # the lab's lock holds it (the starter's: an extra)
        "receiver: TRACE is set and OpenTelemetry is not installed; install its hashed lock "
        "(pip install --require-hashes -r requirements.txt), or unset TRACE"
    ]
    assert "opentelemetry-sdk==" in (ROOT / "requirements.txt").read_text(encoding="utf-8")


class Collector(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP endpoint on loopback: it keeps every span it is sent (POST /v1/traces)."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), CollectorHandler)
        self.spans, self.paths = [], []


class CollectorHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.server.paths.append(self.path)  # the exporter's own: base URL + /v1/traces
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.server.spans += [
                    (span.name, {a.key: a.value for a in span.attributes}) for span in scope.spans
                ]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


def test_otlp_sends_the_receivers_span_to_the_endpoint_it_is_given(lab, tmp_path):
    """TRACE=otlp (the observe profile's setting): the receiver sends its batch by OTLP over
    HTTP to OTEL_EXPORTER_OTLP_ENDPOINT, and flushes it when SIGTERM stops it."""
    collector = Collector()
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{collector.server_port}"
    env = {**lab, "TRACE": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    server = ReceiverProcess(env, tmp_path / "receiver.log").start()
    try:
        workflow.TicketClient(lab["API_URL"]).create("Traced", key=OPERATION)
    finally:
        assert server.stop() == 0
        collector.shutdown()
    assert collector.paths == ["/v1/traces"]  # where Jaeger's OTLP/HTTP receiver listens
    [(name, attributes)] = collector.spans
    assert name == "POST /tickets"
    assert attributes[KEY].string_value == OPERATION
    assert attributes["receiver.replay"].bool_value is False


def test_a_commands_last_spans_reach_otlp_though_it_skips_the_teardown(lab, receiver):
    """A command's batch of spans leaves in an exit handler (OpenTelemetry's TracerProvider
    shutdown). The script's own last handler ends the process without the interpreter's
    teardown (commandline.end_without_teardown): it runs after that one, so nothing is lost;
    and the command's exit code and its whole stdout are as main() left them."""
    collector = Collector()
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    env = {
        **lab,
        "TRACE": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}",
    }
    try:
        done = run_command(
            [sys.executable, "-m", "labs", "start", "--thread", "otlp", "--operation", "otlp"],
            env,
            timeout=60,
        )
    finally:
        collector.shutdown()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["event"] == "done"
    effects = [attributes for name, attributes in collector.spans if KEY in attributes]
    assert effects and {a[KEY].string_value for a in effects} == {"otlp"}


@pytest.mark.fast
def test_a_command_without_trace_after_a_traced_one_in_one_process_traces_nothing(tmp_path):
    """An in-process caller (the guides' runs) runs commands one after another: TRACE unset
    turns off what a TRACE before it turned on, and leaves a caller's own use() alone."""
    tracing.start(str(tmp_path / "spans.jsonl"), "workflow")
    assert tracing.TRACER is not None
    tracing.start("", "workflow")
    assert tracing.TRACER is None
    tracing.use(InMemorySpanExporter(), "workflow")
    try:
        tracing.start("", "workflow")
        assert tracing.TRACER is not None
    finally:
        tracing.stop()


@pytest.mark.fast
def test_a_trace_file_that_cannot_be_written_is_one_line_and_a_usage_error(lab, tmp_path, capsys):
    """A missing folder is made (as CHECKPOINT_DB's); a file where the folder would be is not."""
    (tmp_path / "a-file").write_text("")
    env = {**lab, "TRACE": str(tmp_path / "a-file" / "spans.jsonl")}
    assert workflow.main(["start", "--thread", "t"], env) == exitcodes.EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [
        f"workflow.py: TRACE={env['TRACE']!r} cannot be written: Not a directory"
    ]
    assert tracing.TRACER is None  # nothing half turned on


@pytest.mark.fast
@pytest.mark.parametrize("setting", ["1", "true", "OTLP"])
def test_a_trace_setting_that_is_neither_otlp_nor_a_file_is_a_usage_error(
    lab, tmp_path, monkeypatch, capsys, setting
):
    monkeypatch.chdir(tmp_path)  # where a file named 1 would land
    env = {**lab, "TRACE": setting}
    assert workflow.main(["tickets"], env) == exitcodes.EXIT_USAGE
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"workflow.py: TRACE={setting!r} is neither otlp nor a file")
    assert list(tmp_path.iterdir()) == [] and tracing.TRACER is None


@pytest.mark.fast
def test_a_full_disk_under_the_trace_file_is_one_line_and_the_run_goes_on(lab, receiver, capsys):
    """/dev/full: every write fails with ENOSPC. The command makes its ticket and says once that
    its spans are lost (the SDK would log a traceback for each span)."""
    env = {**lab, "TRACE": "/dev/full"}
    try:
        assert workflow.main(["post", "--operation", OPERATION], env) == 0
    finally:
        tracing.stop()
    assert capsys.readouterr().err.splitlines() == [
        "tracing: TRACE='/dev/full' cannot be written (No space left on device); this "
        "process's spans are lost, the run goes on"
    ]


@pytest.mark.fast
def test_otlp_to_a_collector_that_is_not_there_costs_one_bounded_try(monkeypatch, caplog):
    """A closed port: the exporter retries with backoff (1, 2, 4 s) until its timeout, 10 s by
    default, which held every traced command ~7 s at its exit. With OTLP_TIMEOUT_S it tries
    once more at most."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TIMEOUT", raising=False)
    tracing.start("otlp", "test")
    with tracing.run("t"):
        pass
    tracing.stop()  # the batch's export, as at a command's exit
    retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) <= 1, [r.getMessage() for r in retries]


@pytest.mark.fast
def test_trace_keys_without_spans_to_read_is_one_line_and_its_exit_code(lab, tmp_path, capsys):
    """trace-keys (lab 05) with no file named, a file that is not spans (text, binary, JSON that
    is not an object, a keyed span without its fields), or one whose spans carry no key sent
    from a node: one line each, never a traceback or a pass that checked nothing."""
    env = {k: v for k, v in lab.items() if k != "TRACE"}
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "log.txt").write_text("receiver: started\n")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00spans")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    keyed_in_node = {"attributes": {KEY: OPERATION, "langgraph.node": "create_ticket"}}
    (tmp_path / "nameless.jsonl").write_text(json.dumps(keyed_in_node) + "\n")
    typed = "python -m labs trace-keys FILE (Docker: docker compose -p stateful-lab run --rm"
    for argv, code, said in [
        ([], exitcodes.EXIT_USAGE, f"trace-keys reads a spans file: name it, as in {typed}"),
        ([str(tmp_path / "binary.jsonl")], exitcodes.EXIT_USAGE, "line 1, is not a span"),
        ([str(tmp_path / "list.jsonl")], exitcodes.EXIT_USAGE, "line 1, is not a span"),
        ([str(tmp_path / "nameless.jsonl")], exitcodes.EXIT_USAGE, "lacks its name"),
        ([str(tmp_path / "log.txt")], exitcodes.EXIT_USAGE, "log.txt, line 1, is not a span"),
        ([str(tmp_path / "none.jsonl")], exitcodes.EXIT_USAGE, "No such file"),
        ([str(tmp_path / "empty.jsonl")], exitcodes.EXIT_THREAD, "were the runs started"),
    ]:
        assert lab_py.main(["trace-keys", *argv], env) == code, argv
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and said in err, err
    typo = tmp_path / "typo" / "spans.jsonl"  # TRACE as the runs had it, mistyped
    assert lab_py.main(["trace-keys"], {**env, "TRACE": str(typo)}) == exitcodes.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "No such file" in err, err
    assert not typo.parent.exists()  # read, never created


def test_trace_keys_compares_each_effect_of_a_node_with_itself(lab, receiver, memory, tmp_path):
    """Lab 07's in-node shape sends two effects from create_ticket in one attempt, the ticket's
    key and KEY:approval, both POST /tickets: two effects, not a key that changed. Approved, the
    node runs again and sends both keys again. Each effect is compared with its own attempts."""
    spans = tmp_path / "spans.jsonl"
    start = ["start", "--thread", "t", "--operation", OPERATION, "--mode", "ledger"]
    assert lab_py.main([*start, "--approval", "in-node"], lab) == 0
    assert lab_py.main(["approve", "--thread", "t"], lab) == 0
    spans.write_text(
        "".join(span.to_json(indent=None) + "\n" for span in memory.get_finished_spans())
    )
    posts = {s["attributes"][KEY] for s in exported(memory) if s["name"] == "POST /tickets"}
    assert posts == {OPERATION, f"{OPERATION}:approval"}  # two effects from one node
    assert lab_py.main(["trace-keys", str(spans)], lab) == 0
