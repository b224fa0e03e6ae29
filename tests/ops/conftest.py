import os
import shutil

import pytest


@pytest.fixture
def promtool() -> str:
    """Debian's promtool (package `prometheus`, which `.ci/run` installs): skipped without it, saying so,
    and failing under CI=true."""
    path = shutil.which("promtool")
    if path is None:
        reason = "promtool is missing: apt-get install prometheus (`.ci/run` installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; the rule checks may not be skipped in CI")
        pytest.skip(reason)
    return path
