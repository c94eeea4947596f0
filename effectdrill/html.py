"""The drill's report as one HTML file (`--html PATH`): a page people open, or a build keeps.

One self-contained file: the styles are inline, there is no script, no font and no image, so
it opens the same from a build's artifact, a mail attachment or a disk with no network. A header
names the graph, the command and the LangGraph version; then the counts, the clean run, a
legend and one matrix per durability mode, each row coloured by its verdict with the verdict
word in the cell (colour is never the only sign), what the database held at the kill and what
ran on recovery; then the requests sent again.
"""

import html
import os
import stat
import tempfile
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from effectdrill import advice, outbound
from effectdrill.errors import safe

MARK = "<!-- effectdrill report -->"  # the first line of every report: ours to overwrite
VERDICTS = (  # css class, the word a row's verdict starts with, what it means
    ("ok", "ok", "the effects counted as in the clean run"),
    ("duplicate", "DUPLICATE", "an effect counted more often than in the clean run"),
    ("missing", "MISSING", "an effect counted less often than in the clean run"),
    ("failed", "FAILED", "the resume raised"),
    ("unreached", "not reached", "the run never came to this point: no verdict"),
)


def write(report, path, graph="", command=""):
    """Write the report to `path` (replaced in one rename: a reader never sees half of it)."""
    text = render(report, graph, command)
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".effectdrill-", suffix=".html", dir=folder)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


def refuse_foreign(path):
    """A reason not to write `path`, or None: a file that is not an earlier report is not ours,
    nor is a folder, and a missing folder cannot hold one."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"--html {path}: no folder {folder}"
    if os.path.islink(path):  # replaced, a link would be gone; followed, it writes elsewhere
        return f"--html {path} is a symbolic link: name the file itself"
    if os.path.isdir(path):
        return f"--html {path} is a folder: name a file"
    if os.path.exists(path) and not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO: open hangs
        return f"--html {path} is not a regular file (a FIFO, a device): name a file"
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8", errors="replace") as existing:
                first = existing.readline().strip()
        except OSError as error:
            return f"--html {path}: {error.strerror}"
        if first != MARK:
            return f"--html {path} exists and is not an effectdrill report: not overwritten"
    if not os.access(folder, os.W_OK):
        return f"--html {path}: the folder {folder} is not writable"
    return None


def render(report, graph="", command=""):
    """The page, as a string."""
    title = f"effectdrill: {graph}" if graph else "effectdrill report"
    parts = [
        MARK,
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<header><h1>{esc(title)}</h1><dl>",
        item("command", f"<code>{esc(command)}</code>" if command else "-"),
        item(
            "LangGraph",
            esc(
                f"{package_version('langgraph')} (langgraph-checkpoint "
                f"{package_version('langgraph-checkpoint')})"
            ),
        ),
        item("written", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        "</dl></header>",
        counts_section(report),
        clean_section(report),
        legend(),
    ]
    parts += [matrix_section(report, mode) for mode in report.clean]
    parts.append(requests_section(report))
    parts.append("</body></html>\n")
    return "\n".join(p for p in parts if p)


# helpers


def counts_section(report):
    summary = report.summary()
    failed = len(report.failed)
    unreached = sum(1 for row in report.rows if row_class(row) == "unreached")
    cells = [
        ("crash points", summary["points"], ""),
        ("duplicates", len(report.duplicates), "duplicate" if report.duplicates else "ok"),
        ("missing", len(report.missing), "missing" if report.missing else "ok"),
        ("failed resumes", failed, "failed" if failed else "ok"),
        ("not reached", unreached, "unreached" if unreached else ""),
    ]
    uncounted = (report.requests or {}).get("not counted", 0)
    if report.requests is not None:
        cells.append(("requests not counted", uncounted, "duplicate" if uncounted else "ok"))
    boxes = "".join(
        f'<div class="count {cls}" data-count="{esc(name)}"><b>{value}</b> {esc(name)}</div>'
        for name, value, cls in cells
    )
    verdict = "ok" if report.ok else "found"
    line = esc(report.summary_line())
    return (
        f'<section id="counts"><h2>Counts</h2><div class="counts">{boxes}</div>'
        f'<p class="summary {verdict}">{line}</p></section>'
    )


def clean_section(report):
    wrong = report.clean_findings()
    rows = []
    for mode, counts in report.clean.items():
        cells = ", ".join(f"{esc(e)} {n}" for e, n in counts.items()) or "no effect counted"
        rows.append(f'<tr data-mode="{esc(mode)}"><th>{esc(mode)}</th><td>{cells}</td></tr>')
    flags = "".join(
        f'<li class="duplicate"><b>REPEATED</b> {esc(effect)}: {esc(why)}'
        + (f"<br><small>fix: {esc(advice.clean_fix(why))}</small>" if advice.clean_fix(why) else "")
        + "</li>"
        for effect, why in wrong.items()
    )
    verdict = (
        f'<ul class="flags">{flags}</ul>'
        if flags
        else '<p class="ok-text">ok: nothing repeated in the clean run</p>'
    )
    return (
        '<section id="clean"><h2>The clean run (the baseline)</h2>'
        f'<table class="clean">{"".join(rows)}</table>{verdict}</section>'
    )


def legend():
    items = "".join(
        f'<li><span class="chip {cls}">{esc(word)}</span> {esc(meaning)}'
        + (
            f"<br><small>fix: {esc(advice.VERDICTS[word][1])}</small>"
            if advice.VERDICTS[word][1]
            else ""
        )
        + "</li>"
        for cls, word, meaning in VERDICTS
    )
    repeats = "".join(
        f'<li data-repeat="{esc(kind)}"><b>{esc(words)}</b>: {esc(meaning)}</li>'
        for kind, (words, meaning) in advice.REPEATS.items()
    )
    return (
        f'<section id="legend"><h2>Legend</h2><ul class="legend">{items}</ul>'
        f'<h3>Requests sent again</h3><ul class="legend">{repeats}</ul></section>'
    )


def matrix_section(report, mode):
    from effectdrill.report import counts_cell, distinct, plural, ran_cell, verdict_cell

    row_fixes = advice.row_fixes

    rows = [row for row in report.rows if row.durability == mode]
    clean = report.clean[mode]
    effects = list(clean)
    for row in rows:
        effects += [e for e in row.effects() if e not in effects]
    head = "".join(f"<th>{esc(e)}<br><small>clean {clean.get(e, 0)}</small></th>" for e in effects)
    body = []
    for number, row in enumerate(rows, 1):
        cls = row_class(row)
        counts = "".join(
            f'<td class="n{" hot" if e in row.duplicates() + row.missing() else ""}" '
            f'data-effect="{esc(e)}">{esc(counts_cell(row.counts(e)))}</td>'
            for e in effects
        )
        threads = " ".join(run.thread for run in row.runs)
        body.append(
            f'<tr class="row {cls}" data-verdict="{esc(row.verdict)}" '
            f'data-threads="{esc(threads)}"><td class="num">{number}</td>'
            f'<td class="point">{esc(row.point)}</td>'
            f'<td class="saved">{esc(distinct(run.saved for run in row.runs))}</td>'
            f'<td class="ran">{esc(distinct(ran_cell(run.ran) for run in row.runs))}</td>'
            f'{counts}<td class="verdict {cls}">{esc(verdict_cell(row))}</td>'
            f'<td class="engine">{esc(row.engine)}</td></tr>'
        )
        fixes = row_fixes(row)
        if fixes:  # how to fix it, under the row: its node, its tool call, the fix
            lines = "".join(f"<li>{esc(fix)}</li>" for fix in fixes)
            body.append(
                f'<tr class="fix {cls}" data-point="{esc(row.point)}"><td></td>'
                f'<td colspan="{len(effects) + 5}"><b>how to fix</b><ul>{lines}</ul></td></tr>'
            )
    runs = f", {len(rows[0].runs)} runs each" if rows and len(rows[0].runs) > 1 else ""
    engine, why = report.engines.get(mode, ("kill", ""))
    told = f'<p class="engine">engine: {esc(engine)} ({esc(why)})</p>' if why else ""
    return (
        f'<section class="mode" id="mode-{esc(mode)}" data-mode="{esc(mode)}">'
        f"<h2>durability {esc(mode)}: {plural(len(rows), 'crash point')}{runs}</h2>{told}"
        '<table class="matrix"><thead><tr><th>#</th><th>point (killed before)</th>'
        f"<th>saved at the kill</th><th>ran on recovery</th>{head}<th>verdict</th>"
        "<th>engine</th></tr>"
        f"</thead><tbody>{''.join(body)}</tbody></table></section>"
    )


def requests_section(report):
    lines = []
    for row in report.rows:
        for repeat in row.requests:
            words, meaning = advice.REPEATS.get(repeat["repeat"], (repeat["repeat"], ""))
            if not repeat.get("counted", True):
                words += ", NOT COUNTED by the observer"
            cls = "duplicate" if repeat["repeat"] in outbound.FINDINGS else "ok"
            sent = " ".join(map(str, repeat["sent"]))
            lines.append(
                f"<tr><td>{esc(row.durability)}</td><td>{esc(row.point)}</td>"
                f"<td><code>{esc(repeat['endpoint'])}</code></td>"
                f"<td>{esc(sent)} (clean {repeat['clean']})</td>"
                f'<td class="verdict {cls}">{esc(words)}</td>'
                f"<td>{esc(row.node)}{esc(''.join(f'; {t}' for t in row.tools))}</td>"
                f"<td><small>{esc(meaning)}</small></td></tr>"
            )
    if not lines:
        return ""
    return (
        '<section id="requests"><h2>Requests sent again (POST and PATCH)</h2>'
        '<table class="matrix"><thead><tr><th>durability</th><th>point</th><th>request</th>'
        "<th>sent</th><th>repeat</th><th>node</th><th>what it means, how to fix it</th></tr>"
        f"</thead><tbody>{''.join(lines)}</tbody></table>"
        f"<p>{esc(outbound.totals_line(report.requests))}</p></section>"
    )


def row_class(row):
    verdict = row.verdict
    for cls, word, _ in VERDICTS:
        if verdict.startswith(word):
            return cls
    return "failed"


def item(name, value):
    return f"<dt>{esc(name)}</dt><dd>{value}</dd>"


def package_version(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def esc(value):
    return html.escape(safe(value), quote=True)


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1b1b;background:#fff}
h1{font-size:1.4em;margin:0 0 .4em}h2{font-size:1.1em;margin:1.4em 0 .5em}
header dl{display:grid;grid-template-columns:max-content 1fr;gap:.1em 1em;margin:0}
header dt{font-weight:600}header dd{margin:0}code{font:12px/1.3 monospace;word-break:break-all}
.counts{display:flex;flex-wrap:wrap;gap:.5em}
.count{border:1px solid #bbb;border-radius:4px;padding:.3em .7em}.count b{font-size:1.2em}
.summary{font-family:monospace;font-size:12px}
table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:.25em .5em;vertical-align:top}
th{background:#f2f2f2;text-align:left;font-weight:600}
.matrix td.point,.matrix td.saved,.matrix td.ran{font:12px/1.3 monospace;overflow-wrap:normal;
word-break:normal;min-width:10em}
td.n{text-align:right;font-family:monospace}td.n.hot{font-weight:700}td.num{color:#666}
.ok{background:#dcf3dc}.duplicate{background:#f8c9c4}.missing{background:#fde3b0}
.failed{background:#e2d4f0}.unreached{background:#e6e6e6;color:#444}
td.verdict{font-weight:600}
.summary.found{background:#f8c9c4}.summary.ok{background:#dcf3dc}
.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:.4em 1.5em}
.chip{display:inline-block;border:1px solid #999;border-radius:3px;padding:0 .4em;
font-weight:600;min-width:5em;text-align:center}
.flags{padding-left:1.2em}.flags li{padding:.2em .4em;margin:.2em 0}
.ok-text{color:#1d6b1d}
"""
