"""labs/WORKSHOP.md, the plan for a room: each lab it names exists, each time it gives is the
one `make demo` measured through Docker (tools/workshop-times.json, written by the demo's own
--times), its typing and reading times are counted from the guide at the plan's stated rates,
each slot holds them, and each track's slots and breaks add up to the track's length. No run
here: the demo's --times is exercised on a run test_demo.py makes anyway."""

import json
import math
import re

import pytest

from tools.local import ROOT
from tools.runner import parse_guide

pytestmark = pytest.mark.fast

PLAN = ROOT / "labs" / "WORKSHOP.md"
TIMES = ROOT / "tools" / "workshop-times.json"
TRACK = re.compile(r"^## (?:The )?(\d+)-(minute|hour) track", re.M)
ROW = re.compile(  # | order | [lab](guide) | type or show | measured | typing | reading | slot |
    r"^\| (\d+) \| \[[^\]]+\]\(([^)]+)\) \| (type|show) \| (\d+) s \| (\d+ min|-) \| (\d+) min "
    r"\| (\d+) min \|",
    re.M,
)
TYPED_PER_MIN = 200  # characters of the guide's commands a learner types in a minute
READ_PER_MIN = 200  # words of the guide's prose (outside its code blocks) read in a minute
FENCED = re.compile(r"^```.*?^```", re.S | re.M)
AROUND = re.compile(r"^Around the labs: (\d+) min", re.M)  # framing, breaks, questions
TOLERANCE_S = 1  # the plan gives the demo's seconds rounded to whole seconds


def tracks():
    """{minutes: ([(order, guide, how, measured_s, slot_min, typing, reading_min)], around_min)}
    from the plan (typing: "N min" or "-" for a lab that is shown)."""
    text = PLAN.read_text(encoding="utf-8")
    heads = list(TRACK.finditer(text))
    found = {}
    for head, after in zip(heads, heads[1:] + [None], strict=True):
        body = text[head.end() : after.start() if after else len(text)]
        total = int(head.group(1)) * (60 if head.group(2) == "hour" else 1)
        rows = [
            (int(o), guide, how, int(s), int(m), typing, int(reading))
            for o, guide, how, s, typing, reading, m in ROW.findall(body)
        ]
        found[total] = (rows, int(AROUND.search(body).group(1)))
    return found


def test_the_plan_has_a_three_hour_and_a_ninety_minute_track():
    assert sorted(tracks()) == [90, 180]


def test_each_lab_it_names_exists_and_comes_in_order():
    for total, (rows, _) in tracks().items():
        assert [order for order, *_ in rows] == list(range(1, len(rows) + 1)), total
        for _, guide, *_ in rows:
            assert (PLAN.parent / guide).is_file(), guide
        guides = [guide for _, guide, *_ in rows]
        assert guides == sorted(guides), f"{total}: the labs build on each other, in order"


def test_its_times_are_the_demos_measured_through_docker():
    measured = json.loads(TIMES.read_text(encoding="utf-8"))["guides"]
    for rows, _ in tracks().values():
        for _, guide, _, seconds, slot, *_ in rows:
            run = measured[guide]  # the demo wrote it: backend, seconds, commit, load
            assert run["backend"] == "docker", guide
            assert abs(run["seconds"] - seconds) <= TOLERANCE_S, (guide, run, seconds)
            assert slot * 60 >= 2 * run["seconds"], f"{guide}: no time left to talk about it"


def test_each_track_adds_up_to_its_length():
    for total, (rows, around) in tracks().items():
        assert sum(row[4] for row in rows) + around == total, total


def test_each_slot_holds_the_run_the_typing_and_the_reading():
    """REVIEW D: lab 15's 2,129 characters took ~11 minutes of a 14-minute slot before anyone
    read its prose. A typed lab's slot holds its run, typing and reading; a shown one's, its run
    and reading; the plan's columns are the counts of the guide as it is now."""
    for rows, _ in tracks().values():
        for _, guide, how, seconds, slot, typing, reading in rows:
            text = (PLAN.parent / guide).read_text(encoding="utf-8")
            characters = sum(len(step.command) for step in parse_guide(text))
            words = len(FENCED.sub("", text).split())
            typed_min = math.ceil(characters / TYPED_PER_MIN)
            assert typing == (f"{typed_min} min" if how == "type" else "-"), (guide, characters)
            assert reading == math.ceil(words / READ_PER_MIN), (guide, words)
            needed_s = seconds + 60 * (reading + (typed_min if how == "type" else 0))
            assert slot * 60 >= needed_s, f"{guide}: {slot} min for {needed_s} s"
