"""Model calls and reads are not effects (effectdrill/kinds.py): a loopback fake vendor
(tests/effectdrill_graphs/vendor.py) answers a model's, a payment SDK's and a GraphQL API's
requests; the drill kills the graph for real and reads what each run sent."""

import json
import os
import subprocess
import sys

import pytest
from effectdrill_graphs import vendor

import effectdrill
from effectdrill.kinds import EFFECT, MODEL, READ, classify, query_template
from effectdrill.outbound import NEW_KEY, NO_KEY

INPUT = {"thread": "{thread}"}


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    server = vendor.Fake()
    monkeypatch.setenv("VENDOR_URL", server.url)
    yield server
    server.shutdown()
    server.server_close()


def test_model_calls_made_again_are_shown_apart_and_never_fail_the_run():
    """think's three model calls are made again wherever its writes were not saved: a cost,
    listed apart, and the drill passes (before, each was 'REPEATED WITHOUT A KEY, NOT
    COUNTED' and failed it)."""
    report = effectdrill.drill(
        vendor.build_thinking, INPUT, lambda thread: {}, allow_no_effects=True
    )
    assert report.ok, report.table()
    (row,) = [row for row in report.rows if row.requests]
    assert row.point.startswith("put_writes think")
    assert sorted(r["endpoint"] for r in row.requests) == [
        "POST /v1/chat/completions",
        "POST /v1/embeddings",
        "POST /v1/messages",
    ]
    assert {r["repeat"] for r in row.requests} == {MODEL}
    table = report.table()
    read = " ".join(table.split())  # the repeat column wraps between words to fit 120 columns
    assert "model call made again: cost, not an effect" in read
    assert "3 model calls made again (a cost, not an effect)" in table


def test_http_ignore_still_leaves_a_model_out():
    report = effectdrill.drill(
        vendor.build_thinking,
        INPUT,
        lambda thread: {},
        http_ignore=["127.0.0.1:*/v1/chat/*"],
        allow_no_effects=True,
    )
    sent = {r["endpoint"] for row in report.rows for r in row.requests}
    assert sent == {"POST /v1/embeddings", "POST /v1/messages"}


def test_a_vendor_sdks_key_per_attempt_and_a_graphql_mutation_repeat_its_query_does_not():
    report = effectdrill.drill(vendor.build, INPUT, "http")

    # the effects: the price (its per-call ts dropped from the name) and the mutation; the
    # GraphQL query is a read and the model calls are not effects: no column, no finding
    assert report.clean == {
        "sync": {"POST /v1/prices?ts=*": 1, "POST /graphql (mutation CloseIssue)": 1}
    }
    repeats = {r["endpoint"]: r["repeat"] for row in report.rows for r in row.requests}
    assert repeats == {
        "POST /v1/chat/completions": MODEL,
        "POST /v1/embeddings": MODEL,
        "POST /v1/messages": MODEL,
        "POST /v1/prices?ts=*": NEW_KEY,
        "POST /graphql (mutation CloseIssue)": NO_KEY,
    }
    assert {f["point"] for f in report.duplicates} == {
        "put_writes pay [branch:to:triage]",
        "put_writes triage [done]",
    }
    assert "query Issues" not in report.table()


@pytest.mark.parametrize(
    ("host", "path", "body", "kind"),
    [
        ("api.openai.com:443", "/v1/chat/completions", None, MODEL),  # its host says so
        ("api.openai.com:443", "/v1/responses", None, MODEL),
        ("gw.example:443", "/v1/chat/completions", '{"model": "m", "messages": []}', MODEL),
        ("gw.example:443", "/v1/chat/completions", None, EFFECT),  # unread body: not hidden
        ("r.openai.azure.com:443", "/openai/deployments/gpt/chat/completions", None, MODEL),
        ("r.openai.azure.com:443", "/openai/deployments/gpt/embeddings", None, MODEL),
        ("api.anthropic.com:443", "/v1/messages", None, MODEL),
        ("sms.example:443", "/v1/messages", '{"model": "x", "to": "+1", "body": "hi"}', EFFECT),
        ("gw.example:443", "/graphql", '{"query": "{ viewer { login } }"}', READ),
        ("gw.example:443", "/graphql", '{"query": "mutation { close(id: 1) { id } }"}', EFFECT),
        ("gw.example:443", "/graphql", '{"extensions": {"persistedQuery": {}}}', EFFECT),
        ("gw.example:443", "/search", '{"query": "query for shoes"}', EFFECT),
        (
            "gw.example:443",
            "/graphql",
            '{"query": "query A { a } mutation B { b }", "operationName": "B"}',
            EFFECT,
        ),
        ("gw.example:443", "/graphql", '[{"query": "{ a }"}, {"query": "query { b }"}]', READ),
    ],
)
def test_what_a_request_is(host, path, body, kind):
    assert classify("POST", host, path, body)[0] == kind


def test_an_endpoints_name_drops_the_query_values_that_differ_per_call():
    query = "ts=1733220000123&api-version=2024-06-01&expand=items&id={thread}&nonce=a8f3k2"
    assert query_template(query) == "ts=*&api-version=2024-06-01&expand=items&id={thread}&nonce=*"


def test_the_report_says_how_to_fix_each_flagged_row(tmp_path, fake):
    """The prebuilt agent's tool pays through the SDK (a key per request): the flagged row
    names its node, the tool and its call id, says 'a key per attempt' with the fix and the
    lab, in --json and in the HTML page (its legend explains every verdict and repeat kind);
    the page as headless Chromium builds it says the same. Run as the lab runs it (labs/drill.py),
    which tells effectdrill where each fix is taught."""
    from html.parser import HTMLParser

    from chromium_helpers import chromium

    from effectdrill import advice
    from tools.local import ROOT

    page = tmp_path / "report.html"
    argv = [sys.executable, "-m", "labs.drill", "effectdrill_graphs.vendor:agent", "--json"]
    argv += ["--input", '{"messages": [["user", "{thread}"]]}', "--observe", "http"]
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    done = subprocess.run([*argv, "--html", str(page)], env=env, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    *rows, _ = [json.loads(line) for line in done.stdout.splitlines()]
    flagged = [r for r in rows if r["verdict"] != "ok"]
    assert [r["point"] for r in flagged] == ["put_writes tools (Send) [branch:to:agent, messages]"]
    (row,) = flagged
    assert row["node"] == "tools" and row["tools"] == ["tool create_price, call call-create_price"]
    (new_key,) = [fix for fix in row["fix"] if fix.startswith("REPEATED UNDER A NEW KEY")]
    assert "tool create_price, call call-create_price" in new_key
    assert "mints a key per attempt" in new_key and "tool call id" in new_key
    assert "labs/05-where-the-key-comes-from.md" in new_key

    class Fixes(HTMLParser):
        def __init__(self):
            super().__init__()
            self.fixes, self.point, self.text = {}, None, []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "tr" and "fix" in (attrs.get("class") or "").split():
                self.point = attrs["data-point"]
                self.fixes[self.point] = ""

        def handle_endtag(self, tag):
            self.point = None if tag == "tr" else self.point

        def handle_data(self, data):
            self.text.append(data)
            if self.point is not None:
                self.fixes[self.point] += data

    def check(html_text):
        reader = Fixes()
        reader.feed(html_text)
        assert list(reader.fixes) == [row["point"]]  # every flagged row, and only those
        fix = reader.fixes[row["point"]]
        assert "how to fix" in fix and "node tools" in fix
        assert "tool create_price, call call-create_price" in fix and "mints a key" in fix
        text = "".join(reader.text)
        for words, _meaning in advice.REPEATS.values():  # the legend: every repeat kind
            assert words in text
        assert all(word in text for word in advice.VERDICTS)  # and every verdict

    check(page.read_text(encoding="utf-8"))
    check(chromium(page.as_uri(), "--dump-dom"))  # skipped loudly where Chromium is missing


@pytest.mark.fast
def test_the_fixes_name_no_lab_until_told_where_each_is_taught():
    """effectdrill alone (the starter's copy) gives each fix without a pointer; the lab's entry
    point (labs/drill.py) names a lab for every topic; an unknown topic is refused."""
    from effectdrill import advice
    from labs.drill import TAUGHT

    def said():
        fixes = [fix for _, fix in advice.VERDICTS.values()]
        fixes += [fix for _, fix in advice.REPEATS.values()]
        return " ".join([*fixes, *map(advice.clean_fix, ["after an interrupt", "RetryPolicy"])])

    assert "labs/" not in said()
    assert set(TAUGHT) == set(advice.TOPICS)
    try:
        advice.teach(TAUGHT)
        assert all(place in said() for place in TAUGHT.values())
        with pytest.raises(ValueError, match="unknown topics \\['keys'\\]"):
            advice.teach({"keys": "labs/02-the-keyed-fix.md"})
    finally:
        advice.TAUGHT.clear()
        advice.teach({})
    assert "labs/" not in said()


def test_the_command_line_reads_as_typed_and_the_shell_reads_it_back():
    from effectdrill.__main__ import typed

    argv = ["m:g", "--input", '{"order": "{thread}"}', "--resume-with", '"it\'s"', "--json"]
    line = typed(argv)
    assert """ m:g --input '{"order": "{thread}"}' --resume-with""" in line
    assert line.endswith(""" --resume-with "\\"it's\\"" --json""")  # no '"'"' splices
    shell = ["sh", "-c", f"printf '%s\\n' {line[line.index(' m:g ') + 1 :]}"]
    back = subprocess.run(shell, capture_output=True, text=True)
    assert back.stdout.splitlines() == argv
