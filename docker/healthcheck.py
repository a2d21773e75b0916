"""The image's HEALTHCHECK: the management API's /api/health/checks/alarms answers 200 (no
memory or disk alarm in effect; 503 with the alarms otherwise), asked over loopback, where
guest may log in. Plain urllib: slim images have no curl. Exit status 0 is healthy, 1 is not.

WARREN_HEALTHCHECK_USER and WARREN_HEALTHCHECK_PASSWORD name another user where guest is gone.
"""

import base64
import os
import sys
import urllib.error
import urllib.request

port = os.environ.get("WARREN_MANAGEMENT_PORT", "15672")
user = os.environ.get("WARREN_HEALTHCHECK_USER", "guest")
password = os.environ.get("WARREN_HEALTHCHECK_PASSWORD", "guest")
request = urllib.request.Request(
    f"http://127.0.0.1:{port}/api/health/checks/alarms",
    headers={"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()},
)
try:
    with urllib.request.urlopen(request, timeout=4) as response:
        sys.exit(0 if response.status == 200 else 1)
except (urllib.error.URLError, OSError) as error:
    print(f"unhealthy: {error}", file=sys.stderr)
    sys.exit(1)
