"""Open a page in headless Chromium (Debian's package, which .ci/run installs) and return what it
printed: with --dump-dom, the DOM after the page's scripts ran. One launch, a fresh profile, no
traffic of its own (no sync, no component updates, no QUIC)."""

import os
import shutil
import subprocess
import tempfile

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium(url, *flags):
    """Chromium's stdout for url (a file's as_uri() or an http:// address); skipped loudly
    without Chromium, failed instead when LAB_REQUIRE_CHROMIUM=1."""
    if not os.path.exists(CHROMIUM):
        reason = f"CHROMIUM SKIPPED: no {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("LAB_REQUIRE_CHROMIUM") == "1":
            pytest.fail(reason.replace("SKIPPED", "REQUIRED (LAB_REQUIRE_CHROMIUM=1)"))
        pytest.skip(reason)
    # A short temp folder: Chromium's socket path under pytest's tmp_path is too long for it.
    profile = tempfile.mkdtemp(prefix="chromium-", dir="/tmp")
    try:
        done = subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags, url],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ | {"TMPDIR": profile},
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    return done.stdout
