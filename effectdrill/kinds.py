"""What a recorded request is (an effect, a read, a model call) and its endpoint's name.

- A model call: a POST to a model API (OpenAI and Azure OpenAI chat/completions, completions,
  responses, embeddings; Anthropic messages). Made again after a kill it costs money and
  changes nothing outside: shown apart, never a finding. Recognised by its host
  (api.openai.com, *.openai.azure.com, api.anthropic.com) or, on any host (a proxy, a
  gateway, a local model server), by its path and a JSON body that names a `model`; a body
  the observer cannot read leaves it an effect: a real effect is never hidden on a guess.
- A read: a GraphQL POST whose operation is a `query` (GraphQL sends reads as POSTs). A
  `mutation` (or a body it cannot read: a persisted query's hash) is an effect, named by its
  operation: `POST /graphql (mutation closeIssue)`.
- An endpoint's name is its method, its path (the run's thread id taken out by outbound.py) and
  its query string with the values that differ per call dropped (`?ts=*`): a value is kept
  when it is a word (letters, `-`, `_`, `.`, like `expand=items`) or a date-like version
  (`api-version=2024-06-01`), and dropped otherwise (numbers, ids, timestamps, tokens), so a
  nonce or a timestamp does not split one endpoint into many and hide its repeats.
"""

import json
import re
from urllib.parse import parse_qsl, quote

EFFECT, READ, MODEL = "effect", "read", "model call"
# RFC 9110 section 9.2.2: GET, HEAD, OPTIONS and TRACE are safe, PUT and DELETE idempotent; a
# repeat of POST or PATCH is a new effect unless the service deduplicates it.
EFFECT_METHODS = ("POST", "PATCH")
MODEL_HOSTS = ("api.openai.com", "api.anthropic.com")
AZURE_OPENAI = ".openai.azure.com"

MODEL_APIS = "(chat/completions|completions|responses|embeddings)"
AZURE_PATH = re.compile(rf"^/openai/(deployments/[^/]+/|v1/)?{MODEL_APIS}$")
OPENAI_PATH = re.compile(rf"/{MODEL_APIS}/?$")
ANTHROPIC_PATH = "/v1/messages"
KEPT_VALUE = re.compile(r"[A-Za-z_.{}-]{1,40}|\d{4}-\d{2}-\d{2}[\w.-]*")
# an operation's head: its type, its name, its variables, its directives, then its selection
OPERATION = re.compile(
    r"\b(query|mutation|subscription)\b\s*([A-Za-z_]\w*)?\s*(\([^)]*\))?[^{}()]*\{"
)


def classify(method, host, path, body):
    """(kind, operation) of a request: EFFECT, READ or MODEL, and a GraphQL operation's name
    ("mutation closeIssue") or ""."""
    if method.upper() not in EFFECT_METHODS:
        return READ, ""
    hostname = host.rsplit(":", 1)[0].lower()
    document = json_of(body)
    if model_call(hostname, path, document):
        return MODEL, ""
    operations = graphql_operations(document)
    if not operations:
        return EFFECT, ""
    if all(kind == "query" for kind, _ in operations):
        return READ, ", ".join(f"query {name}".strip() for _, name in operations)
    return EFFECT, ", ".join(f"{kind} {name}".strip() for kind, name in operations)


def model_call(hostname, path, document):
    named = isinstance(document, dict) and isinstance(document.get("model"), str)
    if path == ANTHROPIC_PATH:
        return hostname == "api.anthropic.com" or (named and "max_tokens" in document)
    if hostname.endswith(AZURE_OPENAI) or AZURE_PATH.match(path):
        return bool(AZURE_PATH.match(path))
    if not OPENAI_PATH.search(path):
        return False
    return hostname in MODEL_HOSTS or named


def graphql_operations(document):
    """[(operation type, name)] of a GraphQL request body, [] when it is not one (or one part
    of it cannot be read: then it is an effect like any POST)."""
    batch = document if isinstance(document, list) else [document]
    found = []
    for request in batch:
        if not isinstance(request, dict) or not isinstance(request.get("query"), str):
            return []
        operation = operation_of(request["query"], request.get("operationName"))
        if operation is None:
            return []
        found.append(operation)
    return found


def operation_of(text, name=None):
    """The type and name of the operation a GraphQL document runs: the one named `name`, else
    its first (a document that starts with `{` is a query, GraphQL's shorthand); None when
    the text is no GraphQL document."""
    text = re.sub(r"#[^\n]*", "", text)  # comments
    text = re.sub(r'"""(.|\n)*?"""|"(\\.|[^"\\])*"', '""', text)  # strings: no keywords there
    definitions = [
        (match.group(1), match.group(2) or "")
        for match in OPERATION.finditer(text)
        if depth_at(text, match.start()) == 0
    ]
    if name:
        for kind, found in definitions:
            if found == name:
                return kind, name
    if text.lstrip().startswith("{"):
        return "query", ""
    return definitions[0] if definitions else None


def depth_at(text, index):
    """How many braces and parentheses are open at index: 0 for a top-level definition."""
    depth = 0
    for char in text[:index]:
        depth += char in "{(" or -(char in "})")
    return depth


def query_template(query):
    """The query string with each value that differs per call replaced by `*` (see above)."""
    if not query:
        return ""
    pairs = parse_qsl(query, keep_blank_values=True)
    return "&".join(
        f"{quote(k, safe='{}')}={quote(v, safe='{}-_.') if KEPT_VALUE.fullmatch(v) else '*'}"
        for k, v in pairs
    )


def json_of(body):
    """The JSON a request's body holds, or None (no body, a stream, not JSON)."""
    if isinstance(body, bytes | bytearray | memoryview):
        body = bytes(body).decode("utf-8", errors="replace")
    if not isinstance(body, str) or not body.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None
