"""What a receiver process did since it started, as Prometheus counters (GET /metrics).

Standard library only: the text exposition format is a few lines of text. The counters start
at 0 with each process, as Prometheus expects of a counter; the tickets themselves are in the
database. No label carries a key: one series per status.
"""

import threading
from collections import Counter

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"  # the text exposition format
DURATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
#                     seconds, from accepting a connection to its answer ready to be written:
#                     from a loopback request up to a busy database's two busy timeouts


class Metrics:
    """Counters named by the service (name -> help text), answers by status, and durations."""

    def __init__(self, counters):
        self.lock, self.counters = threading.Lock(), counters
        self.counts = dict.fromkeys(counters, 0)
        self.answers_by_status = Counter()
        self.buckets = [0] * (len(DURATION_BUCKETS_S) + 1)  # the last: slower than them all
        self.duration_sum_s = 0.0

    def add(self, name, count=1):
        with self.lock:
            self.counts[name] += count

    def answered(self, status, seconds):
        """Count one answer; httpguard.GuardedServer calls it just before the answer is written."""
        bucket = next((i for i, le in enumerate(DURATION_BUCKETS_S) if seconds <= le), -1)
        with self.lock:
            self.answers_by_status[status] += 1
            self.buckets[bucket] += 1
            self.duration_sum_s += seconds

    def render(self):
        """The Prometheus text page: receiver_<name>_total for each counter, then the answers."""
        with self.lock:
            lines = []
            for name, text in self.counters.items():
                lines += help_and_type(f"receiver_{name}_total", "counter", text)
                lines.append(f"receiver_{name}_total {self.counts[name]}")
            text = "Answers, by status (each counted just before it is written)."
            lines += help_and_type("receiver_requests_total", "counter", text)
            lines += [
                f'receiver_requests_total{{code="{status}"}} {count}'
                for status, count in sorted(self.answers_by_status.items())
            ]
            name = "receiver_request_duration_seconds"
            text = "Seconds from a connection accepted to its answer, ready to be written."
            lines += help_and_type(name, "histogram", text)
            total = 0
            for le, count in zip(
                [*map(str, DURATION_BUCKETS_S), "+Inf"], self.buckets, strict=True
            ):
                total += count
                lines.append(f'{name}_bucket{{le="{le}"}} {total}')
            lines += [f"{name}_sum {self.duration_sum_s!r}", f"{name}_count {total}"]
        return "\n".join(lines) + "\n"


def help_and_type(name, kind, text):
    """The # HELP and # TYPE lines that open a metric's series."""
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
