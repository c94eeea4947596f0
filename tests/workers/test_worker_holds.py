"""Lab 10's hold (labs/worker_holds.py) keeps its job while the worker is alive, however late the
worker's own heartbeat is: on a loaded machine pgqueuer's beats, from the event loop, came later
than WORKER_HEARTBEAT_S, and another worker took the held job before the guide froze its worker.

Real Postgres (a database of the test's own) and pgqueuer's real queue table; no worker process:
nothing but the hold beats the job, so its heartbeat is the hold's own by construction.
"""

import asyncio
import threading
import uuid
from types import SimpleNamespace

import psycopg

from labs.worker_holds import LabHold
from labs.worker_queue import enqueue, open_queue
from tools.local import wait_until

HANG_GUARD_S = 60  # only a hang, or the hold not beating, reaches it


async def picked_job_with_a_late_heartbeat(url, owner):
    """One held job, picked by `owner`, its last beat an hour old: a starved event loop's."""
    queries = await open_queue(url)
    operation = {"thread": "case-6", "operation_id": "case-6:v1", "title": "t"}
    job = await enqueue(queries, {**operation, "lab_hold": "before-request"})
    table = queries.qbe.qualified.queue_table
    await queries.driver.execute(
        f"UPDATE {table} SET status = 'picked', queue_manager_id = $1, "  # noqa: S608
        "heartbeat = NOW() - interval '1 hour' WHERE id = $2",
        owner,
        job,
    )
    return operation | {"lab_hold": "before-request"}, job, table


def test_a_held_run_beats_its_jobs_heartbeat_until_another_worker_takes_the_job(database):
    owner = uuid.uuid4()
    operation, job, table = asyncio.run(picked_job_with_a_late_heartbeat(database, owner))
    args = SimpleNamespace(queue_manager_id=owner, queue_table=table, checkpoint_db=database)
    hold = LabHold(operation, job, args)
    holding = threading.Thread(target=hold.wait, daemon=True)
    holding.start()

    with psycopg.connect(database, autocommit=True) as conn:

        def heartbeat_age_s():
            row = conn.execute(
                f"SELECT extract(epoch FROM NOW() - heartbeat) FROM {table} WHERE id = %s",  # noqa: S608
                (job,),
            ).fetchone()
            return float(row[0])

        wait_until(lambda: heartbeat_age_s() < 60, HANG_GUARD_S, "the hold's heartbeat")
        assert holding.is_alive()  # still ours: still held
        # Another worker takes the job (pgqueuer's stale re-pick sets its own queue_manager_id).
        conn.execute(
            f"UPDATE {table} SET queue_manager_id = %s, "  # noqa: S608
            "heartbeat = NOW() - interval '1 hour' WHERE id = %s",
            (uuid.uuid4(), job),
        )
        holding.join(HANG_GUARD_S)
        assert not holding.is_alive()  # the hold lets its run go on
        assert heartbeat_age_s() > 60  # and beats no job that is no longer its own
    hold.finished(None)
