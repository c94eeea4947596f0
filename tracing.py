"""The key on the trace: OpenTelemetry spans that carry an effect's idempotency key, off by default.

When TRACE is set, each program makes spans (OpenTelemetry's SDK) and joins them with W3C
trace context (the `traceparent` header):

    workflow,  run                  one run of a thread; a drained run ends with a `drained`
    worker                          event and run.drained=true, its status not ERROR
               effect ticket        Effect.perform: idempotency.key, effect.name (ticket),
                                    effect.state (the ledger's row when it returned: confirmed,
                                    unknown, ...) and effect.how (sent, receipt: nothing sent,
                                    adopted: found by lookup)
               POST /tickets        the request itself, traceparent injected into its headers;
                                    made by an effect, it carries effect.name too
    receiver   POST /tickets        the keyed POST, its parent taken from traceparent:
                                    idempotency.key, receiver.replay (true: answered with what the
                                    key made before), ticket.id

Made inside a graph node, the effect's span and its request's carry thread and langgraph.node
too: every attempt of one effect of one step of one thread sends one key, so more than one key
for an effect of a thread's node means something that changes between attempts went into it.

A resumed run is another process, so its spans are in another trace than the first attempt's:
what joins the two attempts and the receiver's one ticket is the attribute idempotency.key.

    TRACE=""                 off (the default): nothing here imports OpenTelemetry, and the
                                 receiver and the ledger need nothing but the standard library
    TRACE=otlp               spans sent by OTLP over HTTP to OTEL_EXPORTER_OTLP_ENDPOINT
                                 (the exporter's own variable; default http://localhost:4318),
                                 in batches, every 5 s (OTEL_BSP_SCHEDULE_DELAY, in ms), each
                                 export given OTLP_TIMEOUT_S (1 s) unless
                                 OTEL_EXPORTER_OTLP_TIMEOUT says otherwise: the exporter's own
                                 10 s, spent retrying a collector that is not there, made every
                                 command ~7 s slower
    TRACE=PATH               each span appended to the file PATH as one JSON line, as it ends
                                 (a path with a / or ending in .jsonl: any other value, 1 or
                                 true, is a usage error, not a file of that name); its folder
                                 is made if it is missing

Tracing never stops or slows a run for long: spans that cannot be exported are lost, with one
line on stderr (a trace file that cannot be written: once per process).

A span is exported when it ends. A process killed (SIGKILL) inside a span never ends it, so that
span is in no file and no backend: when `workflow.py start` is killed after the answer, its `run`
span is missing, while its POST, which ended before the kill, is there. With otlp, a kill also
loses the ended spans of the batch not sent yet.
"""

import contextlib
import contextvars
import functools
import os
import sys
from urllib.parse import parse_qs

KEY = "idempotency.key"  # the attribute every span of an effect carries: what joins them
EFFECT = "effect.name"  # the effect a span was made for (its Effect's name): one node may send
#                         several, each with its own key
IN_EFFECT = contextvars.ContextVar("in_effect", default=None)  # the effect being performed
OTLP_TIMEOUT_S = 1.0  # seconds for one OTLP export, retries included, unless the exporter's
#                       variables set it: a collector on loopback answers in milliseconds
TRACER = None  # None: tracing is off; start() or use() sets it
PROVIDER = None
STARTED = False  # whether start() (TRACE) turned it on, not a caller's use()


class TracingError(Exception):
    """TRACE cannot work here: one line that says why."""


def start(setting, service):
    """Turn tracing on as TRACE says (see above) for the program named service. An empty setting
    turns off what an earlier start turned on (an in-process caller's command after a traced one
    traces nothing), not what use() turned on."""
    global STARTED
    if not setting:
        if STARTED:
            stop()
        return
    if setting != "otlp" and "/" not in setting and not setting.endswith(".jsonl"):
        raise TracingError(  # TRACE=1, true, OTLP: a file of that name was never meant
            f"TRACE={setting!r} is neither otlp nor a file (a path with a / or ending "
            "in .jsonl); set TRACE=otlp, or TRACE=spans.jsonl, or unset it"
        )
    try:
        import opentelemetry.sdk.trace  # noqa: F401 (installed?)
    except ImportError:
        raise TracingError(
            "TRACE is set and OpenTelemetry is not installed; install its hashed lock "
            f"(pip install --require-hashes -r {otel_lock()}), or unset TRACE"
        ) from None
    if setting == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        named = any(os.environ.get(f"OTEL_EXPORTER_OTLP{s}_TIMEOUT") for s in ("", "_TRACES"))
        exporter = OTLPSpanExporter(timeout=None if named else OTLP_TIMEOUT_S)
        provider = use(exporter, service, batch=True)
    else:
        try:
            provider = use(JsonLines(setting), service)
        except OSError as error:
            raise TracingError(f"TRACE={setting!r} cannot be written: {error.strerror}") from None
    STARTED = True
    return provider


def otel_lock():
    """The lock file that installs OpenTelemetry, as this folder ships it: requirements-otel.txt
    where it is an extra of its own, else requirements.txt (which then holds it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    extra = "requirements-otel.txt"
    return extra if os.path.exists(os.path.join(here, extra)) else "requirements.txt"


def use(exporter, service, batch=False):
    """Export this process's spans through exporter (a test's InMemorySpanExporter, say)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    global TRACER, PROVIDER, STARTED
    stop()  # a second start in one process (an in-process caller) replaces the first
    STARTED = False
    PROVIDER = TracerProvider(resource=Resource.create({"service.name": service}))
    PROVIDER.add_span_processor((BatchSpanProcessor if batch else SimpleSpanProcessor)(exporter))
    TRACER = PROVIDER.get_tracer(__name__)
    return PROVIDER


def stop():
    """Export what is left and turn tracing off."""
    global TRACER, PROVIDER, STARTED
    if PROVIDER is not None:
        PROVIDER.shutdown()
    TRACER = PROVIDER = None
    STARTED = False


@contextlib.contextmanager
def effect_span(name, key, ledger):
    """Effect.perform's span; yields traced(outcome), which notes how it was made."""
    if TRACER is None:
        yield lambda outcome: outcome
        return
    attributes = {KEY: key, EFFECT: name, **in_node()}
    with TRACER.start_as_current_span(f"effect {name}", attributes=attributes) as span:
        performing = IN_EFFECT.set(name)  # its requests' spans name it too
        try:
            yield lambda outcome: (span.set_attribute("effect.how", outcome.how), outcome)[1]
        finally:
            IN_EFFECT.reset(performing)
            with contextlib.suppress(Exception):  # the span must not hide what went wrong
                span.set_attribute("effect.state", ledger.get(key).state)


@contextlib.contextmanager
def outgoing(request, key=None):
    """A client span around an HTTP request (urllib.request.Request): traceparent injected."""
    if TRACER is None:
        yield QUIET
        return
    from opentelemetry import propagate, trace

    path, _, query = request.selector.partition("?")
    key = key or parse_qs(query).get("key", [None])[0]  # a lookup: GET /tickets?key=KEY
    attributes = {"http.request.method": request.get_method(), "url.full": request.full_url}
    effect = {EFFECT: IN_EFFECT.get()} if IN_EFFECT.get() else {}
    attributes.update({KEY: key, **effect, **in_node()} if key is not None else {})
    kind = trace.SpanKind.CLIENT
    with TRACER.start_as_current_span(f"{request.get_method()} {path}", kind=kind) as span:
        span.set_attributes(attributes)
        carrier = {}
        propagate.inject(carrier)  # traceparent: this span's trace and id
        for name, value in carrier.items():
            request.add_header(name, value)
        try:
            yield span
        except Exception as error:
            if isinstance(getattr(error, "code", None), int):  # an HTTPError: it was answered
                span.set_attribute("http.response.status_code", error.code)
            raise


def serves(post):
    """Handler.post in a server span whose parent is the caller's traceparent, when it sent one."""

    @functools.wraps(post)
    def traced(handler, path):
        if TRACER is None:
            return post(handler, path)
        from opentelemetry import propagate, trace

        parent = propagate.extract({k.lower(): v for k, v in handler.headers.items()})
        kind = trace.SpanKind.SERVER
        with TRACER.start_as_current_span(f"POST {path}", parent, kind=kind) as span:
            status, answer = post(handler, path)
            span.set_attribute("http.response.status_code", status)
            return status, answer

    return traced


def note(attributes):
    """Attributes (a dict) on the current span, when tracing is on; None values are left out."""
    if TRACER is not None:
        from opentelemetry import trace

        span = trace.get_current_span()
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})


@contextlib.contextmanager
def run(thread):
    """A run of a thread: the span its effects' spans are children of."""
    if TRACER is None:
        yield QUIET
        return
    with TRACER.start_as_current_span("run", attributes={"thread": thread}) as span:
        yield span


def drained(span, reason):
    """A drain is a clean stop, not a failure: an event and an attribute, the status left unset."""
    span.set_attribute("run.drained", True)
    span.add_event("drained", {"reason": str(reason)})


# helpers


def in_node():
    """The thread and the LangGraph node a span is made in ({} outside a node): what groups one
    step's attempts, whose spans are in one trace per process. Read from LangGraph's config of
    the running node (langgraph/config.py's get_config), only where LangGraph is imported."""
    config = sys.modules.get("langgraph.config")
    try:
        config = config.get_config() if config else {}
    except RuntimeError:  # not inside a node
        return {}
    found = {
        "thread": config.get("configurable", {}).get("thread_id"),
        "langgraph.node": config.get("metadata", {}).get("langgraph_node"),
    }
    return {name: value for name, value in found.items() if value is not None}


class Quiet:
    """What the context managers yield with tracing off: every call does nothing."""

    def set_attribute(self, *_):
        pass

    def add_event(self, *_):
        pass


QUIET = Quiet()


class JsonLines:
    """The span exporter of TRACE=PATH: each span one JSON line (ReadableSpan.to_json),
    appended in one write (O_APPEND), so that threads, and processes sharing the file, never
    interleave two lines."""

    def __init__(self, path):
        self.path, self.failed = path, False
        if not os.path.exists(folder := os.path.dirname(path) or "."):
            os.makedirs(folder)  # as CHECKPOINT_DB's; a file in its way is the open's error
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            for span in spans:
                os.write(self.fd, (span.to_json(indent=None) + "\n").encode())
        except OSError as error:  # a full disk: the run goes on, its spans are lost
            if not self.failed:
                self.failed = True
                print(
                    f"tracing: TRACE={self.path!r} cannot be written ({error.strerror}); "
                    "this process's spans are lost, the run goes on",
                    file=sys.stderr,
                    flush=True,
                )
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis=None):
        return True

    def shutdown(self):
        os.close(self.fd)
