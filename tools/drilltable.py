"""effectdrill's terminal table, read back: for the demo's picture of a drill (a matrix of crash
points x effects) and its on-screen summary (the rows that differ from the clean run; the whole
table folded).

The table is effectdrill's `Report.table()` (effectdrill/report.py): per durability mode a line
`durability MODE: N crash points`, a header `point  saved  ran on recovery  EFFECT...  verdict`
whose second line gives each effect's `(clean N)`, then a row per crash point, a long cell
wrapped onto lines of its own in the same column (a row starts at the margin, its continuation
lines with spaces); then the requests block (`requests sent again ...`, a header `point  request
...`) and the `requests:` and `summary:` lines. Columns are found from the header line's words,
as the table aligns them.
"""

import re
import textwrap
from dataclasses import dataclass, field

FIRST = ("point", "saved", "ran on recovery")  # the columns before the effects
POINT_W = 44  # the summary's point column: the verdict beside it stays whole on a projector


@dataclass
class Point:
    name: str
    counts: dict  # effect -> the cell as printed ('2', '1 2 1', '1×3 2×2', '-')
    verdict: str

    def state(self, effect, clean):
        """'duplicate', 'missing' or 'ok' for one cell against the clean run's count; 'none'
        where the row has no count (not reached)."""
        found = [int(n) for n in re.findall(r"(?<![×\d])\d+", self.counts.get(effect, ""))]
        if not found:
            return "none"
        if any(n > clean for n in found):
            return "duplicate"
        return "missing" if any(n < clean for n in found) else "ok"


@dataclass
class Table:
    title: str  # 'durability sync: 16 crash points'
    effects: list
    clean: dict  # effect -> the clean run's count
    points: list = field(default_factory=list)

    def differs(self, point):
        return point.verdict != "ok"


def split_cells(header, lines):
    """Each line cut at the header's column starts: a list of cells per line."""
    starts = [0] + [m.end() for m in re.finditer(r"  +(?=\S)", header)]
    ends = starts[1:] + [None]
    return [[line[a:b].strip() for a, b in zip(starts, ends, strict=True)] for line in lines]


def tables(lines):
    """The main tables of a drill's output (its requests block is not one: it has no effect
    columns)."""
    found, i = [], 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("point ") and i and lines[i - 1].startswith("durability ")):
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip():
            end += 1
        rows = split_cells(line, lines[i:end])
        names = rows[0]
        if tuple(names[:3]) != FIRST or names[-1] != "verdict":
            i = end
            continue
        effects = names[3:-1]
        clean = {}
        for effect, cell in zip(effects, rows[1][3:-1], strict=True):
            match = re.fullmatch(r"\(clean (\d+)\)", cell)
            clean[effect] = int(match.group(1)) if match else 0
        table = Table(lines[i - 1], effects, clean)
        for raw, row in zip(lines[i + 2 : end], rows[2:], strict=True):
            if raw[:1].strip():  # a new row: its first line holds the counts
                counts = dict(zip(effects, row[3:-1], strict=True))
                table.points.append(Point(row[0], counts, row[-1]))
            elif table.points:  # a continuation: the long cells' further words
                point = table.points[-1]
                point.name = f"{point.name} {row[0]}".strip()
                point.verdict = f"{point.verdict} {row[-1]}".strip()
        found.append(table)
        i = end
    return found


def screen_summary(lines):
    """The drill's output for a screen: each table as its title with how many rows are ok, and
    only the rows that differ from the clean run, one line each (point, counts, verdict); the
    requests block to its `requests:` line; the rest (the summary line) as printed."""
    out, i = [], 0
    found = {table.title: table for table in tables(lines)}
    while i < len(lines):
        line = lines[i]
        heads = i + 1 < len(lines) and lines[i + 1].startswith("point ")
        table = found.get(line) if heads else None
        if line.startswith("requests sent again"):
            while i < len(lines) and not lines[i].startswith("requests: "):
                i += 1
            continue
        if table is None:
            out.append(line)
            i += 1
            continue
        differ = [p for p in table.points if table.differs(p)]
        ok = len(table.points) - len(differ)
        if not differ:
            counts = ", ".join(f"{e} {n}" for e, n in table.clean.items())
            out.append(f"{line}: every row ok, as the clean run ({counts})")
        else:
            out.append(f"{line}: {ok} ok (as the clean run), {len(differ)} not:")
            rows = [
                ["point", *table.effects, "verdict"],
                ["", *(f"(clean {table.clean[e]})" for e in table.effects), ""],
            ]
            for p in differ:  # a long point on lines of its own, as the drill wraps it
                names = textwrap.wrap(
                    p.name, POINT_W, subsequent_indent="  ", break_on_hyphens=False
                )
                rows.append([names[0], *(p.counts[e] for e in table.effects), p.verdict])
                rows += [[name, *[""] * (len(table.effects) + 1)] for name in names[1:]]
            widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
            out += [
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                for row in rows
            ]
        i += 1
        while i < len(lines) and lines[i].strip():  # past the table's own lines
            i += 1
    return out
