"""An HTTP replica for traffic tests: a process that answers every GET with its name and port.

``replica_command(name, *ports, delay=..., linger=...)`` is the command of a container: it
binds each port on every address, in the order given, after ``delay`` seconds (so a readiness
probe on the last port fails first), and answers ``<name>:<port>``; with ``linger`` it ignores
SIGTERM (so its deletion takes the grace period, its endpoint terminating meanwhile). A name
of ``None`` is the pod's own, from ``POD_NAME`` (the downward API), for a Deployment's template.
"""

from __future__ import annotations

import sys

SCRIPT = """
import http.server, os, signal, sys, threading, time
name = sys.argv[1] or os.environ["POD_NAME"]
delay, linger, ports = float(sys.argv[2]), sys.argv[3] == "linger", [int(p) for p in sys.argv[4:]]
if linger:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(delay)
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{name}:{self.server.server_address[1]}".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
for port in ports:
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("serving", flush=True)
while True: time.sleep(1)
"""


def replica_command(
    name: str | None, *ports: int, delay: float = 0.0, linger: bool = False
) -> list[str]:
    return [
        sys.executable, "-c", SCRIPT, name or "", str(delay), "linger" if linger else "stop",
        *(str(p) for p in ports),
    ]  # fmt: skip
