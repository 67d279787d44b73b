"""The fake ``sbx`` CLI (the ``sbx`` script beside it starts it): forwards its argv to the fake
Docker Sandboxes daemon (sbx_daemon.py) and
relays what it answers: stdout and stderr bytes as they come, then its exit code.

The daemon's URL is ``BOXWRIGHT_FAKE_SBX_URL``; without it this CLI says sbx is not installed
properly, as a broken installation would.
"""

import base64
import http.client
import json
import os
import sys
import urllib.parse


def main() -> int:
    url = os.environ.get("BOXWRIGHT_FAKE_SBX_URL")
    if not url:
        sys.stderr.write("sbx: cannot reach sandboxd (BOXWRIGHT_FAKE_SBX_URL is not set)\n")
        return 1
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=None)
    conn.request("POST", "/run", body=json.dumps({"argv": sys.argv[1:]}), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    code = 1
    while True:
        line = response.readline()
        if not line:
            break
        message = json.loads(line)
        if "fd" in message:
            stream = sys.stdout.buffer if message["fd"] == 1 else sys.stderr.buffer
            stream.write(base64.b64decode(message["data"]))
            stream.flush()
        elif "exit" in message:
            code = int(message["exit"])
    return code


if __name__ == "__main__":
    sys.exit(main())
