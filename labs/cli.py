"""The lessons' CLI: workflow.py's commands, plus the switches and commands of the labs.

compose.yaml's `workflow` service runs it; natively it is `python -m labs ARGS`. Every command of
workflow.py works here unchanged. Each switch lives in its lesson's module (labs/__init__.py's
table says which lab it is):

    --mode naive|safe|node-uuid|ledger, --crash-at, --crash     labs/modes.py       (01-06)
    trace-keys [FILE]                                           labs/trace_keys.py  (05)
    --approval [in-node|own-node|before], approve [--reject],   labs/approval.py    (07)
    edit, revoke
    --durability, --crash-at step-boundary, --term-at           labs/boundaries.py  (04, 08, 09)
    LAB_GRAPH_VERSION, LAB_KEY_VERSION, --no-contract, migrate  labs/contract.py    (12)
    saga start|resume|state|refunds|releases                    labs/saga.py        (13)
    --notify, --pay, --mode lookup-resend, messages, payments   labs/keyless.py     (15)
    --retry-after-ack timeout|parse                             labs/retries.py     (17)
    hooks                                                       labs/hooks.py       (18)
    outbox start|resume|state                                   labs/outbox.py      (19)

The ticket graph these switches build is labs/lab_graph.py's; which command runs a saved thread,
labs/threads.py's. This module holds the ticket run's commands (start, resume, approve, state,
migrate), the parser and main.
"""

import os
import sys

import checkpoints
import commandline
import effects
import exitcodes
import failpoints
import workflow
from corrections import login
from exitcodes import EXIT_THREAD, EXIT_USAGE, UserError, command, emit
from httpguard import DEFAULT_WEBHOOK_SECRET as LAB_SECRET
from labs import approval, hooks, inbox, keyless, outbox, relay, saga, trace_keys
from labs.approval import (
    APPROVAL_POINTS,
    APPROVAL_SHAPES,
    APPROVAL_TTL_S,
    approve_bound,
    check_approval,
    edit_title,
    require_ledger_mode,
    reviewer,
    seconds,
)
from labs.boundaries import DURABILITIES, POINTS, TERM_POINTS, step_boundary_saver
from labs.conditions import lost_answer_missing
from labs.contract import (
    EFFECT_NODE,
    INTERRUPT,
    KEY_DERIVATIONS,
    RENAMES,
    contract,
    migrate_thread,
    require_contract,
)
from labs.lab_graph import build_lab_graph
from labs.modes import CRASH_POINTS, KEYLESS_MODES, MODES, LostAckClient
from labs.retries import RETRY_FAILURES
from labs.threads import (
    exists_hint,
    is_outbox,
    is_saga,
    look_first,
    owning_command_line,
    thread_words,
    typed_as,
)

LAB_TABLES = {**inbox.COLUMNS, **relay.COLUMNS, **approval.COLUMNS}  # beside the checkpoints
LESSON_EFFECTS = {  # every effect a lab declares, for reconcile (workflow.py's own TICKET too)
    **effects.declared(vars(workflow)),
    **effects.declared(vars(approval)),
    **effects.declared(vars(keyless)),
    **effects.declared(vars(saga)),
}


def start_ticket_run(args, settings):
    if args.mode in KEYLESS_MODES and not args.pay:
        raise UserError(f"--mode {args.mode} changes only the payment: add --pay", EXIT_USAGE)
    require_ledger_mode(args)
    first = {"operation_id": args.operation, "title": args.title, "mode": args.mode}
    if args.approval:
        first["approval"] = args.approval
    if args.notify:
        first["notify"] = True
    if args.pay:
        first["pay"] = True
    return run_with_failpoints(args, settings, first)


def resume_ticket_run(args, settings):
    return run_with_failpoints(args, settings, None)


def answer_approval(args, settings):
    from langgraph.types import Command

    if not args.approve:  # a stop below names this answer, not the other one
        args.resume = "approve --reject"
    return run_with_failpoints(args, settings, Command(resume=args.approve))


def run_with_failpoints(args, settings, graph_input):
    """commandline.start_or_resume with the lab's failpoints (--crash-at, --term-at) on."""
    if args.crash_at == "step-boundary" and checkpoints.is_postgres(settings.checkpoint_db):
        raise UserError(
            "--crash-at step-boundary needs the SQLite checkpointer (its saver is a SqliteSaver); "
            "unset CHECKPOINT_DB",
            EXIT_USAGE,
        )
    points = {args.crash_at: "kill"} if args.crash_at not in (None, "lost-ack") else {}
    points |= {args.term_at: "term"} if args.term_at else {}
    with failpoints.scoped(points):
        return run_under_contract(args, settings, graph_input)


def show_ticket_state(args, settings):
    version = getattr(args, "graph_version", "1")  # LAB_GRAPH_VERSION; 1 for a bare parse
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        if head and is_saga(head):  # read by the ticket graph, its refund would not show
            raise UserError(
                f"thread {args.thread!r} is a saga (lab 13): "
                f"{command(thread_words('saga state', args.thread))}",
                EXIT_THREAD,
            )
        if head and is_outbox(head):  # lab 19's graph: outbox state reads it
            raise UserError(
                f"thread {args.thread!r} is an outbox run (lab 19): "
                f"{command(thread_words('outbox state', args.thread))}",
                EXIT_THREAD,
            )
        notify = started_with(saver, args, "notify")
        pay = started_with(saver, args, "pay")
        graph = build_lab_graph(
            saver, started_with(saver, args, "approval"), version, notify, pay=pay
        )
        snapshot = graph.get_state(checkpoints.thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    emit("state", values=snapshot.values, next=list(snapshot.next))
    if snapshot.values.get("mode") == "naive" and "key" in snapshot.values:
        print(
            "labs: --mode naive: the key is what prepare computed; create_ticket sends none",
            file=sys.stderr,
        )


# helpers


def graph_for(saver, args, head):
    """The lab's graph for a thread (its saved head, or None): built as the thread was started
    (with its --approval), in the deployed version."""
    values = head.checkpoint["channel_values"] if head else {}
    approval = values.get("approval") if head else getattr(args, "approval", None)
    notify = values.get("notify") if head else getattr(args, "notify", None)
    pay = values.get("pay") if head else getattr(args, "pay", None)
    version, retry = args.graph_version, args.retry_after_ack
    return build_lab_graph(saver, approval, version, notify, retry, pay, args.key_version)


def client_for(args, settings):
    """The receiver's client; --crash-at lost-ack's, whose request asks to lose its answer."""
    client = settings.client()
    if args.crash_at != "lost-ack":
        return client
    operation, mode = getattr(args, "operation", None), getattr(args, "mode", None)  # start's
    return LostAckClient(client, args.thread, lost_answer_missing(args.thread, operation, mode))


def saver_for(args, settings):
    """The step-boundary saver for runs that may pass that point; SQLite's plain one otherwise."""
    if args.graph_command and not checkpoints.is_postgres(settings.checkpoint_db):
        return step_boundary_saver()
    return None


def started_with(saver, args, field):
    """A value the thread was started with (its graph must be built the same way)."""
    return (
        build_lab_graph(saver).get_state(checkpoints.thread_config(args.thread)).values.get(field)
    )


def run_under_contract(args, settings, graph_input):
    """Start (graph_input) or resume (None) args.thread with the lab's graph, client and saver,
    under its contract: only a thread saved under it resumes (--no-contract skips that)."""
    starting = isinstance(graph_input, dict)  # not a resume's Command
    client = client_for(args, settings)
    with (
        checkpoints.open_checkpointer(settings.checkpoint_db, saver_for(args, settings)) as saver,
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
    ):
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        graph = graph_for(saver, args, head)
        current = contract(graph, args.graph_version, args.key_version)
        if head and (line := owning_command_line(head)):  # another command's thread
            raise UserError(line, EXIT_THREAD)
        if head and not starting and not args.no_contract:  # only under its saved contract
            require_contract(graph, args.thread, current, RENAMES.get(args.graph_version))
        snapshot = graph.get_state(checkpoints.thread_config(args.thread))
        check_approval(args, snapshot)
        if args.action == "approve" and snapshot.values.get("approval") == "before":
            graph_input = approve_bound(args, snapshot, ledger)  # recorded before it goes on
        checkpoints.require_thread(graph, args.thread, starting, exists_hint(head))
        final = workflow.run_graph(
            graph, graph_input, args.thread, client, ledger, args.durability, {"contract": current}
        )
    if final is None:
        return exitcodes.EXIT_DRAINED
    if INTERRUPT in final:  # the run waits for a human (a graph with interrupt())
        emit("awaiting_approval", **final[INTERRUPT][0].value)
        return 0
    emit("done", **final)
    return 0


def edit_command(args, settings):
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        if head and (line := owning_command_line(head)):  # another command's thread
            raise UserError(line, EXIT_THREAD)
        contract = head.metadata.get("contract") if head else None
        edit_title(args, graph_for(saver, args, head), contract)


def revoke_command(args, settings):
    with (
        checkpoints.open_checkpointer(settings.checkpoint_db) as saver,
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
    ):
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        values = head.checkpoint["channel_values"] if head else {}
        approval.revoke(args, ledger, values)


def migrate_command(args, settings):
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        graph = graph_for(saver, args, head)
        current = contract(graph, args.graph_version, args.key_version)
        migrate_thread(
            graph, args.thread, current, RENAMES.get(args.graph_version), owning_command_line
        )


def build_lab_parser(graph_version="1", key_version="1"):
    parser = workflow.build_parser(prog="labs")
    # how a hint names a command: python -m labs ..., and compose.yaml's workflow service runs it
    environ = {"LAB_GRAPH_VERSION": graph_version} if graph_version != "1" else {}
    environ |= {"LAB_KEY_VERSION": key_version} if key_version != "1" else {}
    parser.set_defaults(typed=typed_as(parser.prog, "workflow", environ))
    parser.set_defaults(crash_at=None, term_at=None, durability="sync", no_contract=False)
    parser.set_defaults(graph_version=graph_version, key_version=key_version)
    parser.set_defaults(retry_after_ack=None)  # lab 17: start only
    parser.set_defaults(look_first=look_first)  # for the hints: hints.resume_or_warning
    parser.set_defaults(effects=LESSON_EFFECTS)
    actions = parser.actions
    for name, action in [
        ("start", start_ticket_run),
        ("resume", resume_ticket_run),
        ("state", show_ticket_state),
    ]:
        actions.choices[name].set_defaults(run=action)
    for name in ("start", "resume"):
        sub = actions.choices[name]
        crash = sub.add_mutually_exclusive_group()
        crash.add_argument(
            "--crash",
            dest="crash_at",
            action="store_const",
            const="after-ack",
            help="same as --crash-at after-ack",
        )
        crash.add_argument(
            "--crash-at", choices=(*CRASH_POINTS, *APPROVAL_POINTS), help="where the run dies"
        )
        sub.add_argument("--term-at", choices=TERM_POINTS, help="where the run gets SIGTERM")
        sub.add_argument("--durability", choices=DURABILITIES, default="sync")
    actions.choices["resume"].add_argument(
        "--no-contract", action="store_true", help="skip the contract check (lab 12)"
    )
    sub = actions.add_parser("migrate", help="move a thread to this code's contract (lab 12)")
    sub.set_defaults(run=migrate_command)
    sub.add_argument("--thread", default=commandline.Defaulted("demo"), help="checkpoint thread id")
    start_parser = actions.choices["start"]
    start_parser.add_argument("--mode", choices=(*MODES, *KEYLESS_MODES), default="ledger")
    start_parser.add_argument(
        "--approval",
        nargs="?",
        const="in-node",
        choices=APPROVAL_SHAPES,
        help="wait for a human after the ticket: in-node (the default) or own-node",
    )
    keyless.add_message_parser(parser)
    keyless.add_payment_parser(parser)
    start_parser.add_argument(
        "--retry-after-ack",
        choices=RETRY_FAILURES,
        help="lab 17: a RetryPolicy on the effect's node, and a line after the answer that "
        "fails once (timeout: httpx's ReadTimeout; parse: a JSONDecodeError)",
    )
    sub = actions.add_parser("approve", help="answer a run that waits for approval (lab 07)")
    sub.set_defaults(run=answer_approval, graph_command=True)
    sub.set_defaults(resume="approve")  # what goes on after a stop: the answer, again
    sub.add_argument(
        "--thread",
        default=commandline.Defaulted("demo"),
        help="checkpoint thread id (default: demo)",
    )
    sub.add_argument("--reject", dest="approve", action="store_false", help="answer no")
    sub.add_argument(
        "--by", type=reviewer, default=login(), help="who approves (default: your login)"
    )
    sub.add_argument(
        "--valid-for",
        type=seconds,
        default=APPROVAL_TTL_S,
        metavar="SECONDS",
        help=f"--approval before: how long the approval authorizes (default {APPROVAL_TTL_S:g})",
    )
    sub.add_argument(
        "--crash-at", choices=(*CRASH_POINTS, *APPROVAL_POINTS), help="where the run dies"
    )
    thread = dict(default=commandline.Defaulted("demo"), help="checkpoint thread id")
    sub = actions.add_parser("edit", help="change the title a saved run will send (lab 07)")
    sub.set_defaults(run=edit_command)
    sub.add_argument("--thread", **thread)
    sub.add_argument("--title", required=True, help="the new title")
    sub = actions.add_parser("revoke", help="withdraw a run's approval (lab 07, before)")
    sub.set_defaults(run=revoke_command)
    sub.add_argument("--thread", **thread)
    saga.add_saga_parser(actions)
    outbox.add_outbox_parser(actions)
    hooks.add_hooks_parser(actions)
    trace_keys.add_trace_keys_parser(actions)
    return parser


def main(argv=None, environ=None):
    environ = os.environ if environ is None else environ
    version, keys = environ.get("LAB_GRAPH_VERSION", "1"), environ.get("LAB_KEY_VERSION", "1")
    for name, value, known in [
        ("LAB_GRAPH_VERSION", version, EFFECT_NODE),
        ("LAB_KEY_VERSION", keys, KEY_DERIVATIONS),
    ]:
        if value not in known:
            print(f"labs: {name}={value!r} must be 1 or 2", file=sys.stderr)
            return EXIT_USAGE
    parser = build_lab_parser(version, keys)
    parser.set_defaults(listen_host=environ.get("LISTEN_HOST", "127.0.0.1"))
    parser.set_defaults(webhook_secret=environ.get("WEBHOOK_SECRET") or LAB_SECRET)  # hooks
    points = (*POINTS, *saga.SAGA_ACKS, *outbox.OUTBOX_POINTS, *hooks.HOOK_POINTS)
    points += tuple(p for p in APPROVAL_POINTS if p not in points)
    checkpoints.own_tables(
        LAB_TABLES
    )  # labs/inbox.py's and labs/relay.py's, beside the checkpoints
    return workflow.main(argv, environ, parser=parser, points=points)
