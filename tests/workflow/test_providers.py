"""Providers as configuration: each provider's URL, timeout, attempts and token come from the
environment under one rule ({NAME}_URL, {NAME}_TIMEOUT_S, {NAME}_ATTEMPTS, {NAME}_TOKEN), read in
main(), and reach the client built for that provider. Checked with a real request to a loopback
server."""

import dataclasses
import http.server
import json
import threading

import pytest

import exitcodes
import providers
import workflow

MAIL = providers.Provider("MAIL", url="http://127.0.0.1:9")  # a second provider, declared once


@dataclasses.dataclass(frozen=True)
class TwoProviders(workflow.Settings):
    providers: tuple = (workflow.API, MAIL)


class Seen(http.server.BaseHTTPRequestHandler):
    """Records each request; a path /hold is answered only once the test lets it go."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.path, dict(self.headers), json.loads(body)))
        if self.path == "/hold":
            self.server.release.wait(30)
        answer = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Seen)
    server.seen, server.release = [], threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


@pytest.mark.fast
def test_a_second_providers_settings_reach_its_client(server):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    env = {"MAIL_URL": url, "MAIL_TIMEOUT_S": "0.3", "MAIL_ATTEMPTS": "1", "MAIL_TOKEN": "s3cret"}
    settings = TwoProviders.from_environ(env)
    assert settings.provider("API").url == workflow.API.url  # API's defaults, untouched
    assert "s3cret" not in repr(settings)  # a token is never printed

    client = settings.client(name="MAIL")
    assert client.timeout_s == 0.3 and client.attempts == 1
    assert client.call("/mail", {"to": "a@example.com"}, "k-1") == {"ok": True}
    ((path, headers, body),) = server.seen
    assert (path, body) == ("/mail", {"to": "a@example.com"})
    assert headers["Authorization"] == "Bearer s3cret" and headers["Idempotency-Key"] == "k-1"
    # Its timeout: held past 0.3 s, the request has no answer (and may have taken effect).
    with pytest.raises(exitcodes.NoAnswer, match=f"no answer from MAIL at {url}"):
        client.call("/hold", {}, "k-2")
    assert len(server.seen) == 2  # one attempt: MAIL_ATTEMPTS (a timeout is never resent)
    # The API provider's client sends no token: each provider has its own settings.
    assert "Authorization" not in settings.client().headers


@pytest.mark.fast
@pytest.mark.parametrize(
    "name, value", [("MAIL_URL", "mail:25"), ("MAIL_TIMEOUT_S", "soon"), ("MAIL_ATTEMPTS", "0")]
)
def test_a_bad_provider_setting_is_one_line_and_exit_2_naming_it(capsys, tmp_path, name, value):
    env = {"CHECKPOINT_DB": str(tmp_path / "c.sqlite"), name: value}
    code = workflow.main(["state", "--thread", "t"], env, settings_class=TwoProviders)
    out, err = capsys.readouterr()
    assert code == exitcodes.EXIT_USAGE == 2 and out == ""
    assert err.count("\n") == 1 and name in err and repr(value) in err, err
