"""The coordinator's web dashboard: a one-page app, a JSON API, live Server-Sent Events and /metrics,
served by Starlette + uvicorn from a thread of the coordinator.

Modules: serve.py runs uvicorn; security.py checks every request (Host, body size and time, token,
CSRF); app.py holds the routes and views; events.py the event streams; context.py the Farm both
read. With the farm token, every page that shows farm data, the API, the streams and /metrics need
it (login once: the cookie); the page shell, /healthz and /api/time do not. Actions also need the
CSRF token.
"""

from coordinator.dashboard.security import host_allowed
from coordinator.dashboard.serve import DashboardServer, start_dashboard, stop_dashboard

__all__ = ["DashboardServer", "host_allowed", "start_dashboard", "stop_dashboard"]
