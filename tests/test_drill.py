"""The drill, one test per cell: crash, recover as an operator would, count the tickets.

Each cell runs its real workflow processes against a receiver of this test worker's own with
the lost-ack fault on, as `make drill` does; a cell that differs says why, with the commands
it ran and the events they printed.
"""

import json

import pytest

from labs.tools import drill


@pytest.fixture(scope="module")
def drill_lab():
    lab = drill.open_lab("local")
    yield lab
    lab.close()


@pytest.mark.parametrize("cell", drill.cells(), ids=lambda c: c.name.removeprefix("drill:"))
def test_drill_cell(drill_lab, cell):
    result = drill.run_cell(drill_lab, cell)
    assert result["ok"], json.dumps(
        {k: result[k] for k in ("why", "tickets", "expected", "log") if k in result}, indent=1
    )
    assert result["tickets"] == cell.expected("tickets")
