"""The suite runs against a server that is already up (scripts/client-tests.sh starts
one); INFLIGHT_HTTP_PORT and INFLIGHT_METRICS_PORT say where."""

import pytest
import requests

import clientutil


def pytest_sessionstart(session):
    try:
        r = requests.get(clientutil.HTTP + "/v2/health/ready", timeout=10)
    except requests.RequestException as e:
        pytest.exit(f"no server at {clientutil.HTTP}: {e}; start one (scripts/client-tests.sh does)", returncode=3)
    if r.status_code != 200:
        pytest.exit(f"server at {clientutil.HTTP} is not ready: {r.status_code}", returncode=3)


@pytest.fixture(autouse=True)
def _idle_between_tests():
    """Each test starts on an idle server, so metric deltas are its own."""
    clientutil.wait_idle()
    yield
