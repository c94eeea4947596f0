"""effectdrill as this lab runs it: `docker compose -p stateful-lab run --rm drill ARGS` (lab 11),
natively `python -m labs.drill ARGS`. The same command as `python -m effectdrill`, and each fix it
gives ends with the lab that teaches it (effectdrill knows no labs: teach() is told here)."""

import shlex

import commandline
from effectdrill import advice, cli
from effectdrill.__main__ import main as effectdrill_main

TAUGHT = {  # the drill's topic (effectdrill.advice.TOPICS) -> the lab that teaches its fix
    "keyed fix": "labs/02-the-keyed-fix.md",
    "key source": "labs/05-where-the-key-comes-from.md",
    "lost answer": "labs/06-the-lost-acknowledgement.md",
    "interrupt": "labs/07-the-approval-that-runs-twice.md",
    "key expiry": "labs/14-the-key-that-expired.md",
    "ledger": "labs/15-the-ledger.md",
    "retry": "labs/17-the-retry-langgraph-made-for-you.md",
}


# compose.yaml's drill service keeps a failed graph's traceback in its /reports mount
# (EFFECTDRILL_LOG_DIR): its /tmp is gone with the container. The host reads it through the
# same service, as the same user.
REPORTS = "/reports/"
READ_IN_DOCKER = "docker compose -p stateful-lab run --rm --entrypoint cat drill"


def main(argv=None):
    """effectdrill's command line (its exit codes), with the labs named in every fix, and the
    command that reads a kept traceback through Docker."""
    advice.teach(TAUGHT)
    cli.read_logs_with(read_in_docker)
    return effectdrill_main(argv)


def read_in_docker(path):
    """The command that reads a log the drill kept in its container's /reports mount."""
    return f"read it: {READ_IN_DOCKER} {shlex.quote(path)}" if path.startswith(REPORTS) else None


if __name__ == "__main__":
    commandline.run_script(main, "labs.drill", one_run=False)
