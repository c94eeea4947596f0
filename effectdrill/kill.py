"""In a crash child: the Killer, which SIGKILLs the process at its crash state, and the
watchdog that sees when LangGraph waits on a save the Killer holds back (the state cannot come)."""

import asyncio
import linecache
import os
import signal
import sys
import threading
import time

from effectdrill.plan import Counter

SETTLE_DEADLINE_S = 30.0  # seconds a sync kill waits for the calls it lets finish (Killer)


HOLD_DEADLINE_S = 30.0  # seconds a child holding writes waits for the rest of their step


WATCH_EVERY_S = 0.005  # how often a child holding a call checks that LangGraph does not wait on it


WATCH_LOOKS = 3  # looks in a row that find every thread blocked before the child gives up


CHILD_FAILED = 3  # a crash child's exit code when the graph raised (the message is piped)


CHILD_UNREACHED = 4  # a crash child's exit code when LangGraph waited on a held write


CHILD_GAVE_UP = 5  # ... when it held writes for HOLD_DEADLINE_S and the state never came


class Killer(Counter):
    """In a crash child: SIGKILL this process at its CrashState.

    Under sync (settle=True) it first lets the calls finish that LangGraph started earlier
    on other threads and does not wait for (PregelLoop.put_writes and _put_checkpoint submit
    them to the run's BackgroundExecutor, langgraph/pregel/_loop.py and _executor.py): the
    put_writes calls of the same step, and before a put_writes, the put of the checkpoint it
    is for. Any other call that starts meanwhile is held: it never finishes. A held state
    (CrashState.hold) holds those calls and dies once the rest of their step is saved.
    """

    def __init__(self, state, settle=False):
        super().__init__()
        self.state = state
        self.settle = settle
        self.armed = False  # about to kill: calls it does not wait for are held
        self.holding = False
        self.step_of = None  # (namespace, checkpoint id) the held step's writes are for
        self.done = set()  # keys of the calls finished
        self.started = set()
        self.puts = set()  # (namespace, checkpoint id) of every put finished
        self.changed = threading.Condition()
        self.async_changed = None
        self.held_keys = set()
        self.ours = set()  # idents of the Killer's own threads (the watchdog's is its own)
        self.watching = False

    @property
    def carried(self):
        """The numbering and the saves an earlier invoke made (all of them finished: LangGraph
        waits for its saves as an invoke ends): what the next invoke's process goes on from."""
        return self.seen, self.done, self.puts, self.started

    @carried.setter
    def carried(self, value):
        self.seen, self.done, self.puts, self.started = value

    def before(self, call):
        with self.changed:
            key, action = self.decide(call)
            if action == "go":
                return key
            if action == "kill":
                self.changed.wait_for(lambda: self.settled(call), SETTLE_DEADLINE_S)
                die()
            self.held_keys.add(key)
            self.watch()
        threading.Event().wait()  # held: this call never finishes (the process dies first)

    async def abefore(self, call):
        with self.changed:
            key, action = self.decide(call)
        if action == "go":
            return key
        if action == "kill":
            deadline = time.monotonic() + SETTLE_DEADLINE_S
            self.async_changed = self.async_changed or asyncio.Event()
            while not self.settled(call) and time.monotonic() < deadline:
                self.async_changed.clear()
                try:
                    await asyncio.wait_for(self.async_changed.wait(), SETTLE_DEADLINE_S)
                except TimeoutError:
                    break
            die()
        with self.changed:
            self.held_keys.add(key)
            self.watch()
        await asyncio.Event().wait()  # held: this call never finishes

    def decide(self, call):
        """ "go", "kill" (once settled) or "hold" for this call; kills at once unsettled."""
        key = self.number(call)
        self.started.add(key)
        state = self.state
        if key == state.key:
            self.armed = True
            if not self.settle:
                die()
            self.parent = call.group[1:]
            return key, "kill"
        if key == state.closing_put and state.closing_put:  # after the point, in step order
            return key, "hold"
        if self.armed and key not in state.wait and not self.parent_pending(call):
            return key, "hold"
        if key in state.hold:
            self.step_of = call.group[1:]
            self.start_holding()
            return key, "hold"
        if (
            self.holding
            and key not in state.group
            and self.step_of in self.puts
            and not within_subgraph(call.group[1], self.step_of[0])
        ):
            return key, "hold"  # a later call: the state is the step's, nothing after it
        return key, "go"

    def watch(self):
        """Start the watchdog (once): it ends the child at once, as unreached, when LangGraph
        waits for a held call, which can never finish (see waits_for_held)."""
        if not self.watching:
            self.watching = True
            threading.Thread(target=self.watchdog, daemon=True).start()

    def watchdog(self):
        """WATCH_LOOKS looks in a row, no saver call started or finished between them, every
        call started either finished or held, and every other thread blocked: LangGraph waits
        on a held save (an error handler's input, schedule_error_handler in langgraph/pregel/
        _loop.py; a subgraph's checkpoint, which its parent's stream waits for; every save at
        BackgroundExecutor.__exit__, langgraph/pregel/_executor.py), which never finishes."""
        looks, last = 0, None
        while True:
            with self.changed:
                progress = (len(self.started), len(self.done))
                in_flight = self.started - self.done - self.held_keys
            stuck = not in_flight and all_blocked(self.ours)
            looks = looks + 1 if stuck and progress == last else 0
            if looks >= WATCH_LOOKS:
                os._exit(CHILD_UNREACHED)
            last = progress
            time.sleep(WATCH_EVERY_S)

    def parent_pending(self, call):
        """A put while the put_writes about to be killed waits for its checkpoint's put."""
        return call.kind == "put" and self.state.parent_put and self.parent not in self.puts

    def start_holding(self):
        if not self.holding:
            self.holding = True
            timer = threading.Timer(HOLD_DEADLINE_S, os._exit, (CHILD_GAVE_UP,))
            timer.daemon = True
            timer.start()
            self.ours.add(timer.ident)
        self.check_step()

    def check_step(self):
        """A held state dies once every call of its step started, the unheld ones and the
        step's checkpoint saved."""
        state = self.state
        if (
            state.group <= self.started
            and state.group - state.hold <= self.done
            and (self.step_of[1] is None or self.step_of in self.puts)
        ):
            die()

    def settled(self, call):
        if not self.state.wait <= self.done:
            return False
        _, namespace, checkpoint = call.group
        if not self.state.parent_put or checkpoint is None:
            return True
        return (namespace, checkpoint) in self.puts

    def after(self, key, checkpoint=None):
        with self.changed:
            self.done.add(key)
            if checkpoint is not None:
                self.puts.add(checkpoint)
            self.changed.notify_all()
            if self.holding:
                self.check_step()
        if self.async_changed is not None:
            self.async_changed.set()


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def within_subgraph(namespace, outer):
    """Whether a saver call's namespace is a subgraph's within `outer`: a task of the held
    step runs it, so the step's own writes wait for it (it is not a later call)."""
    return len(namespace) > len(outer) and namespace.startswith(outer)


def all_blocked(ours=()):
    """Whether every other thread of this process waits in a blocking primitive with no
    timeout: a lock, a condition or an event of threading.py (a held save waits in one;
    LangGraph waits for a save in Future.result or concurrent.futures.wait, and for its stream
    queue, which wait in one), or an idle pool worker. Then nothing can go on: no node runs (a
    node that sleeps, sends or computes is in its own code, or in a socket's, not in these), no
    save is made. Read from the threads' frames: the innermost Python frame of each."""
    if threading._limbo:  # a thread started and not yet running (threading.py's own table)
        return False
    ours = {threading.get_ident(), *ours}  # the watchdog, the hold's deadline timer
    for ident, frame in sys._current_frames().items():
        if ident not in ours and not blocked(frame):
            return False
    return True


THREADING = os.sep + "threading.py"


IDLE_WORKER = os.path.join("concurrent", "futures", "thread.py")


SELECTORS = os.sep + "selectors.py"


AIOSQLITE = os.path.join("aiosqlite", "core.py")


def blocked(frame):
    """A thread's innermost frame waits with no end of its own: a threading.py wait or acquire
    with no timeout (a timed one ends by itself: a poll), an idle pool worker, an idle event
    loop, or an idle aiosqlite connection's worker."""
    code, local = frame.f_code, frame.f_locals
    if code.co_filename.endswith(IDLE_WORKER):  # and nothing queued it has yet to take
        return code.co_name == "_worker" and getattr(local.get("work_queue"), "empty", bool)()
    if code.co_filename.endswith(SELECTORS):
        return idle_loop(code, local)
    if code.co_filename.endswith(AIOSQLITE):  # waits in tx.get() for a call, none queued
        return (
            code.co_name == "_connection_worker_thread"
            and "tx.get()" in linecache.getline(code.co_filename, frame.f_lineno)
            and getattr(local.get("tx"), "empty", bool)()
        )
    if not code.co_filename.endswith(THREADING):
        return False
    if code.co_name not in ("wait", "wait_for", "acquire", "_wait_for_tstate_lock"):
        return False
    waiter = local.get("waiter")  # Condition.wait's: released when notified (it will run)
    if waiter is not None and not waiter.locked():
        return False
    timeout = local.get("timeout")
    return timeout is None or (code.co_name == "_wait_for_tstate_lock" and timeout == -1)


def idle_loop(code, local):
    """An asyncio event loop in its selector's select() with nothing to wait for: no timeout
    (BaseEventLoop._run_once passes None when no callback is ready and no timer is scheduled;
    EpollSelector.select makes it -1) and no socket but the loop's own wake-up pipe
    (_UnixSelectorEventLoop's self-pipe, registered first): only another thread can wake it."""
    if code.co_name != "select" or local.get("timeout") not in (None, -1):
        return False
    selector = local.get("self")
    return selector is not None and len(selector.get_map()) <= 1
