"""Serve pg_cdc's Prometheus metrics over HTTP: GET /metrics runs `SELECT cdc_prometheus_metrics()`.

postgres_exporter's custom queries can only export gauges and counters from cdc_status(); this
endpoint gives Prometheus everything cdc_prometheus_metrics() exposes, the latency histograms
included (`histogram_quantile(0.99, rate(pg_cdc_end_to_end_latency_seconds_bucket[5m]))`).

    scrape.py --dsn "host=db dbname=postgres user=cdc_monitor" --port 9188

Each scrape opens its own connection (a scrape every 15 s costs a few milliseconds), so a restart
of PostgreSQL needs no restart of this process. When the database cannot be reached the endpoint
answers 503 and Prometheus records `up 0` for the target. The role needs only pg_monitor.
"""
import argparse
import http.server

import psycopg

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def fetch_metrics(dsn, timeout_s):
    """The exposition text of `cdc_prometheus_metrics()`, read over a fresh connection."""
    with psycopg.connect(dsn, connect_timeout=timeout_s, autocommit=True,
                         options=f"-c statement_timeout={timeout_s * 1000}") as conn:
        return conn.execute("SELECT cdc_prometheus_metrics()").fetchone()[0]


def make_handler(dsn, timeout_s):
    """A request handler class bound to one DSN."""

    class Handler(http.server.BaseHTTPRequestHandler):
        """GET /metrics: the exposition; GET /: a pointer to it; anything else: 404."""

        def do_GET(self):
            if self.path.split("?", 1)[0] == "/metrics":
                try:
                    self.reply(200, fetch_metrics(dsn, timeout_s), CONTENT_TYPE)
                except psycopg.Error as e:
                    self.log_error("cdc_prometheus_metrics() failed: %s", str(e).strip())
                    self.reply(503, f"cdc_prometheus_metrics() failed: {e}\n")
            elif self.path == "/":
                self.reply(200, "pg_cdc metrics: /metrics\n")
            else:
                self.reply(404, "not found\n")

        def reply(self, status, text, content_type="text/plain; charset=utf-8"):
            """Sends `text` with `status`."""
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def main():
    """Parses the options and serves until interrupted."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--dsn", default="",
                   help="libpq connection string of the database pg_cdc is installed in "
                        "(default: the PG* environment variables)")
    p.add_argument("--port", type=int, default=9188, help="HTTP port (default 9188)")
    p.add_argument("--bind", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--timeout", type=int, default=10,
                   help="seconds allowed to connect and to run the query (default 10)")
    args = p.parse_args()
    server = http.server.ThreadingHTTPServer((args.bind, args.port), make_handler(args.dsn, args.timeout))
    print(f"serving cdc_prometheus_metrics() on http://{args.bind}:{args.port}/metrics", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
