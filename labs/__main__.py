"""`python -m labs ARGS`: the lessons' CLI (labs/cli.py), workflow.py's commands and the
switches."""

import os
import signal

if __name__ == "__main__":  # a Ctrl-C while the imports below run: one line, not a traceback
    said = b"labs: interrupted\n"  # exit 130, EXIT_INTERRUPTED: nothing has run yet
    signal.signal(signal.SIGINT, lambda *_: (os.write(2, said), os._exit(130)))

import commandline  # noqa: E402 (after the handler: these imports take most of a second)
from labs.cli import main  # noqa: E402

if __name__ == "__main__":
    commandline.run_script(main, "labs")
