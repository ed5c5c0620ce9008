"""The web front end: RQ's HTTP API and an HTML UI (falcon on waitress)."""
