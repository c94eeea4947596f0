"""Graphs for the drill that belong to no lesson module: lab 11's examples (shop, approval,
webhook, and ticket: the lab's own graph, labs/lab_graph.py's, with the receiver as the world),
lab 16's classify and lab 20's assistant, each a lesson that is one drill graph. The saga's and
the outbox's adapters live in their lessons' modules (labs/saga.py, labs/outbox.py)."""
