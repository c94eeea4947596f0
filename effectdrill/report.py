"""The drill's findings: a Run per crash run, a Row per crash point, the Report (its verdicts,
summary, JSON and the terminal table)."""

import itertools
from dataclasses import dataclass, field

from effectdrill import outbound
from effectdrill.advice import row_fixes


@dataclass
class Run:
    """One crash run: was the point reached, what was saved, what the recovery ran, the counts."""

    reached: bool
    saved: str
    ran: list
    counts: dict
    error: str | None = None
    thread: str = ""
    unreached: bool = False  # LangGraph waited on a call the kill held: no counts, no verdict


@dataclass
class Row:
    """One crash point in one durability mode, with its runs (several with repeat)."""

    durability: str
    point: str
    clean: dict
    runs: list = field(default_factory=list)
    requests: list = field(default_factory=list)  # sent again: effectdrill/outbound.py
    tools: list = field(default_factory=list)  # "tool NAME, call ID" of the tasks it re-runs
    engine: str = "kill"  # what made its crash state: "kill" or "snapshot" (snapshot.py)

    @property
    def node(self):
        """The node the point is about: a put_writes' task (a subgraph's as `parent/node`), or
        for a checkpoint the tasks its recovery ran."""
        if self.point.startswith("put_writes "):
            rest = self.point.removeprefix("put_writes ")
            name = rest.split(" [")[0].split(" (")[0].split(" #")[0]
            inside = rest.rsplit("] in ", 1)
            return f"{inside[1].split(' ')[0]}/{name}" if len(inside) == 2 else name
        ran = self.runs[0].ran if self.runs else []
        return ", ".join(dict.fromkeys(ran)) or "-"

    def effects(self):
        names = dict.fromkeys(self.clean)
        for run in self.runs:
            names.update(dict.fromkeys(run.counts))
        return list(names)

    def judged(self):
        """The runs that reached a state of this row: only they can back a verdict."""
        return [run for run in self.runs if not run.unreached]

    def counts(self, effect):
        return [run.counts.get(effect, 0) for run in self.judged()]

    def duplicates(self):
        return [e for e in self.effects() if any(c > self.clean.get(e, 0) for c in self.counts(e))]

    def missing(self):
        return [e for e in self.effects() if any(c < self.clean.get(e, 0) for c in self.counts(e))]

    def failures(self):
        return [run.error for run in self.runs if run.error is not None]

    @property
    def verdict(self):
        words = [
            word
            for word, found in (
                ("DUPLICATE", self.duplicates()),
                ("MISSING", self.missing()),
                ("FAILED", self.failures()),
            )
            if found
        ]
        if not words and self.runs and not self.judged():
            return "not reached"
        return "+".join(words) or "ok"

    def as_json(self):
        return {
            "durability": self.durability,
            "point": self.point,
            "runs": len(self.runs),
            "threads": [run.thread for run in self.runs],
            "reached": [run.reached for run in self.runs],
            "saved": [run.saved for run in self.runs],
            "ran_on_recovery": [run.ran for run in self.runs],
            "counts": {effect: self.counts(effect) for effect in self.effects()},
            "clean": self.clean,
            "errors": self.failures(),
            "verdict": self.verdict,
            "requests": self.requests,
            "node": self.node,
            "tools": self.tools,
            "fix": row_fixes(self),
            "engine": self.engine,
        }


class Report:
    """The drill's findings: rows, duplicates, missing effects, a table, assert_clean()."""

    def __init__(self, expect=None):
        self.rows = []
        self.clean = {}  # durability -> the clean run's counts
        self.reruns = {}  # durability -> {effect: (times, node, why)} a node's re-run repeated
        self.expect = expect or {}
        self.requests = None  # the HTTP observer's totals (effectdrill/outbound.py)
        self.engines = {}  # durability -> (engine, why): what made its rows (snapshot.py)
        self.verified = []  # --verify's rows: {durability, point, same, snapshot, kill}

    @property
    def duplicates(self):
        return [self._finding(row, e, max) for row in self.rows for e in row.duplicates()]

    @property
    def missing(self):
        return [self._finding(row, e, min) for row in self.rows for e in row.missing()]

    @property
    def failed(self):
        return [
            {"durability": row.durability, "point": row.point, "error": error}
            for row in self.rows
            for error in row.failures()
        ]

    def clean_findings(self):
        """{effect: why} for each effect the clean run itself got wrong."""
        found = {}
        for mode, counts in self.clean.items():
            for effect, expected in self.expect.items():
                if counts.get(effect, 0) != expected and effect not in found:
                    found[effect] = f"counted {counts.get(effect, 0)}, expected {expected}"
            for effect, (_, node, why) in self.reruns.get(mode, {}).items():
                if effect not in self.expect and effect not in found:
                    found[effect] = f"{node} re-ran it {why}"
        return found

    @property
    def unreached(self):
        """The points no run reached (LangGraph waited on the save the kill held back)."""
        return [
            {"durability": row.durability, "point": row.point}
            for row in self.rows
            if row.verdict == "not reached"
        ]

    @property
    def repeated_in_clean_run(self):
        return list(self.clean_findings())

    @property
    def ok(self):
        uncounted = bool(self.requests and self.requests["not counted"])
        return (
            not (self.duplicates or self.missing or self.failed or self.repeated_in_clean_run)
            and not uncounted
        )

    def summary(self):
        return {
            "summary": True,
            "points": len(self.rows),
            "clean": next(iter(self.clean.values()), {}),
            "duplicates": self.duplicates,
            "missing": self.missing,
            "repeated_in_clean_run": self.repeated_in_clean_run,
            "failed": self.failed,
            "unreached": self.unreached,
            "requests": self.requests,
            "engines": {m: {"engine": e, "why": w} for m, (e, w) in self.engines.items()},
            "verified": self.verified,
        }

    def table(self, width=None):
        """One table per durability mode, then a summary line; lines fit `width` (120) where
        the columns allow (long cells are cut with '…')."""
        blocks = []
        for mode, clean in self.clean.items():
            rows = [row for row in self.rows if row.durability == mode]
            effects = list(clean)
            for row in rows:
                effects += [e for e in row.effects() if e not in effects]
            header = ["point", "saved", "ran on recovery"]
            header += [f"{e}\n(clean {clean.get(e, 0)})" for e in effects] + ["verdict"]
            lines = [header]
            engine, why = self.engines.get(mode, ("kill", ""))
            for row in rows:
                lines.append(
                    [
                        row.point + ("" if row.engine == engine else f" (by {row.engine})"),
                        distinct(run.saved for run in row.runs),
                        distinct(ran_cell(run.ran) for run in row.runs),
                        *(counts_cell(row.counts(e)) for e in effects),
                        verdict_cell(row),
                    ]
                )
            runs = f", {len(rows[0].runs)} runs each" if rows and len(rows[0].runs) > 1 else ""
            blocks.append(f"durability {mode}: {plural(len(rows), 'crash point')}{runs}\n")
            blocks[-1] += columns(lines, width or TABLE_WIDTH)
            if why and why != NO_WORLD:  # a drill with no world is the kill engine's, as ever
                told = f"engine: {engine} ({why})"
                blocks[-1] += "\n" + "\n".join(wrap(told, width or TABLE_WIDTH))
        requests = outbound.requests_table(self, lambda lines: columns(lines, width or TABLE_WIDTH))
        return "\n\n".join(blocks + ([requests] if requests else []) + [self.summary_line()])

    def summary_line(self):
        parts = [plural(len(self.rows), "crash point")]
        for name, found in (("duplicate", self.duplicates), ("missing", self.missing)):
            effects = ", ".join(sorted({f["effect"] for f in found}))
            parts.append(f"{len(found)} {name}" + (f" ({effects})" if found else ""))
        parts.append(f"{len(self.failed)} failed resume" + ("" if len(self.failed) == 1 else "s"))
        if self.unreached:
            parts.append(f"{len(self.unreached)} not reached")
        wrong = self.clean_findings()
        parts.append(
            "the clean run repeated "
            + ", ".join(f"{effect} ({why})" for effect, why in wrong.items())
            if wrong
            else "clean run ok"
        )
        return "summary: " + ", ".join(parts) + outbound.summary_words(self.requests)

    def assert_clean(self):
        """Raise AssertionError with the table when an effect repeated or went missing."""
        if not self.ok:
            raise AssertionError("an effect repeated or went missing:\n" + self.table())
        return self

    @staticmethod
    def _finding(row, effect, pick):
        counts = row.counts(effect)
        clean = row.clean.get(effect, 0)
        differs = [c for c in counts if c != clean]
        return {
            "durability": row.durability,
            "point": row.point,
            "effect": effect,
            "count": pick(differs),
            "clean": clean,
            "runs": len(counts),
            "times": len([c for c in differs if (c > clean) == (pick is max)]),
        }


NO_WORLD = (  # why auto uses real kills when nothing says what a resume touches (snapshot.py)
    "no world declared (--world, or drill_world beside the observer): the drill cannot "
    "restore what the resume touches"
)


TABLE_WIDTH = 120  # columns a table fits in, where its effect columns leave space


SHRINKABLE = (0, 1, 2)  # point, saved, ran on recovery: wrapped first, the widest first


MIN_CELLS = (28, 18, 18)  # a wrapped point, saved, ran column keeps at least this many


MIN_VERDICT = 20  # and the verdict


def columns(lines, width=TABLE_WIDTH):
    """Align the cells; a row too wide wraps its longest text cells onto more lines."""
    widths = [
        max(len(part) for line in lines for part in line[i].split("\n"))
        for i in range(len(lines[0]))
    ]
    least = dict(zip(SHRINKABLE, MIN_CELLS, strict=True)) | {len(widths) - 1: MIN_VERDICT}
    for i in least:  # never narrower than a column's longest word on a continuation line (its
        #   two spaces' indent before it): no cell breaks mid-word
        words = [len(w) + 2 for line in lines for w in line[i].split()]
        least[i] = min(widths[i], max([least[i], *words]))
    while sum(widths) + 2 * (len(widths) - 1) > width:
        shrinkable = [i for i in least if widths[i] > least[i]]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda i: widths[i] - least[i])] -= 1
    out = []
    for line in lines:
        cells = [wrap(cell, w) for cell, w in zip(line, widths, strict=True)]
        for parts in itertools.zip_longest(*cells, fillvalue=""):
            out.append("  ".join(p.ljust(w) for p, w in zip(parts, widths, strict=True)).rstrip())
    return "\n".join(out)


def wrap(cell, width):
    """The cell in lines of `width` or fewer, broken after a space where it can be."""
    if "\n" in cell:
        return [part for piece in cell.split("\n") for part in wrap(piece, width)]
    lines = []
    while len(cell) > width:
        start = len(cell) - len(cell.lstrip())  # a continuation's indent is no place to break
        cut_at = cell.rfind(" ", start + 1, width + 1)
        if cut_at <= start:
            cut_at = width
        lines.append(cell[:cut_at].rstrip())
        cell = "  " + cell[cut_at:].lstrip()  # a continuation, indented
    return [*lines, cell]


def distinct(values):
    """The different values of a row's runs, in order: 'a | b' when the runs differ."""
    return " | ".join(dict.fromkeys(values))


def ran_cell(ran):
    """'a, b ×3, c': the tasks a recovery ran, a run of one name counted."""
    if not ran:
        return "-"
    cells = []
    for name, group in itertools.groupby(ran):
        times = len(list(group))
        cells.append(name if times == 1 else f"{name} ×{times}")
    return ", ".join(cells)


def counts_cell(counts):
    """'1 2 1' for a few runs; '1×3 2×2' when that is shorter."""
    if not counts:
        return "-"
    plain = " ".join(map(str, counts))
    tallied = " ".join(f"{c}×{counts.count(c)}" for c in dict.fromkeys(counts))
    return plain if len(plain) <= len(tallied) else tallied


def plural(count, noun):
    return f"{count} {noun}" + ("" if count == 1 else "s")


def verdict_cell(row):
    if row.verdict in ("ok", "not reached"):
        return row.verdict
    details = []
    for word, effects in (("DUPLICATE", row.duplicates()), ("MISSING", row.missing())):
        for effect in effects:
            clean = row.clean.get(effect, 0)
            counts = row.counts(effect)
            hits = [c for c in counts if (c > clean if word == "DUPLICATE" else c < clean)]
            times = f" in {len(hits)} of {len(counts)}" if len(counts) > 1 else ""
            details.append(f"{word} {effect}{times}")
    details += [f"FAILED: {error}" for error in row.failures()[:1]]
    return "; ".join(details)
