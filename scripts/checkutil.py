"""What the end-to-end check scripts (sampling_check.py, structured_check.py) share: a
JSON POST that stops the run on an HTTP error, and PASS/FAIL lines that remember the
failures. Standard library only."""
import json
import sys
import urllib.error
import urllib.request


def post(base, path, body):
    """POSTs `body` as JSON to `base + path`; the answer's JSON, or the run ends."""
    r = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                               headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=300) as f:
            return json.loads(f.read())
    except urllib.error.HTTPError as e:
        sys.exit(f"HTTP {e.code} on {path} {json.dumps(body)}: {e.read().decode()}")


class Checks:
    """Prints one line per check; `failed` names those that failed."""

    def __init__(self):
        self.failed = []

    def __call__(self, name, ok, detail=""):
        print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {str(detail)[:600]}"))
        if not ok:
            self.failed.append(name)
