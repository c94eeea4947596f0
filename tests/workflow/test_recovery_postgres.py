"""migrate on Postgres: a refused move writes nothing there either, a good one moves the thread.

A throwaway cluster of the machine's own PostgreSQL binaries (tools.pg); without them the
tier is skipped loudly (LAB_REQUIRE_POSTGRES=1 fails instead). Not in the fast loop: a cluster
takes seconds to start.
"""

import pytest
from test_recovery import history, run, tickets, v2

from labs import contract as contract_lesson


@pytest.fixture
def postgres_url(database):
    return database


def test_on_postgres_a_refused_move_writes_nothing_and_a_good_one_moves(
    lab, receiver, capsys, monkeypatch, postgres_url
):
    env = {**lab, "CHECKPOINT_DB": postgres_url}
    assert run(capsys, env, "start", "--thread", "pg", "--approval", "own-node")[0] == 0
    before = history(env, "pg")
    monkeypatch.setitem(contract_lesson.RENAMES, "2", {"create_ticket": "prepare"})
    assert run(capsys, v2(env), "migrate", "--thread", "pg")[0] == contract_lesson.EXIT_CONTRACT
    assert history(env, "pg") == before
    monkeypatch.undo()
    assert run(capsys, v2(env), "migrate", "--thread", "pg")[1][0]["next"] == ["approval"]
    assert run(capsys, v2(env), "approve", "--thread", "pg")[1][-1]["event"] == "done"
    key = "case-001:open-ticket:v1"  # one ticket, and one ask for approval (lab 07's, a ticket)
    assert [t["key"] for t in tickets(lab)] == [key, f"{key}:approval"]
