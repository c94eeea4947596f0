"""The drill, one test per cell: crash, recover as an operator would, count the tickets.

Each cell runs against a receiver of this test worker's own with the lost-ack fault on, as
`make drill` does. The run that crashes is a real process that really gets its SIGKILL or
SIGTERM; the resumes run workflow.main in this process (make drill runs them as processes too).
A cell that differs says why, with the commands it ran and the events they printed.
"""

import json

import pytest

from tools import drill


@pytest.fixture(scope="module")
def drill_lab():
    lab = drill.open_lab(drill.DrillOptions(backend="local"), in_process=True)
    yield lab
    lab.close()


@pytest.mark.parametrize("cell", drill.cells(), ids=lambda c: c.name.removeprefix("drill:"))
def test_drill_cell(drill_lab, cell):
    result = drill.run_cell(drill_lab, cell)
    assert result["ok"], json.dumps(
        {k: result[k] for k in ("why", "tickets", "expected", "log") if k in result}, indent=1
    )
    assert result["tickets"] == cell.expected("tickets")
