"""The lessons: the package `labs`, beside the guides (NN-*.md) it serves, above the core (the
repository's root: api.py, effects.py, workflow.py, ...), which it imports and which never
imports it. `python -m labs ARGS` is the lessons' CLI (labs/cli.py).

Which module holds lab NN's code (its switches, its graph variant, its commands):

    01-06  the key's source, --mode, the lost ack    labs/modes.py
    04     --durability                               labs/boundaries.py
    05     the key on the trace: trace-keys           labs/trace_keys.py
    07     the approval                               labs/approval.py
    08-09  --crash-at step-boundary, --term-at        labs/boundaries.py
    10     workers (python -m labs.workers)           labs/workers.py: its CLI; worker_queue.py
                                                      (submit, status, wait), worker_run.py (a
                                                      worker), worker_metrics.py (Prometheus),
                                                      worker_holds.py (--lab-hold)
    11     the drill's example graphs                 labs/graphs/ (shop, approval, ticket, ...)
    12     the contract and migrate                   labs/contract.py
    13     the saga                                   labs/saga.py
    14     the receiver's key retention               labs/receiver.py
    15     keyless providers: --notify, --pay         labs/keyless.py
    16     classify your effects (drill)              labs/graphs/classify.py
    17     LangGraph's retry                          labs/retries.py
    18     the webhook endpoint and its inbox         labs/hooks.py, labs/inbox.py; the sender:
                                                      labs/webhooks.py (in labs/receiver.py)
    19     the outbox and its relay                   labs/outbox.py, labs/relay.py
    20     the assistant that sends email (drill)     labs/graphs/assistant.py

The ticket graph those switches build is labs/lab_graph.py's; labs/threads.py says which command
runs a saved thread; labs/cli.py wires the commands into workflow.py's CLI.
"""
