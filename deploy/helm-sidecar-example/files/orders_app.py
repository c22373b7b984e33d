"""An application that receives the orders jsgw pushes: POST /orders, one order per request.

Python's standard library only. Run: python orders_app.py (on 127.0.0.1, port $PORT or 3000).
"""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STOCK = {"apple": 10, "pear": 0}  # no pears yet: orders for pears wait
handled = set()  # the Nats-Msg-Id of every order handled (in real life: in your database)
lock = threading.Lock()  # requests come in on several threads at once


class Orders(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: jsgw reuses its connections

    def do_POST(self) -> None:
        key = self.headers["Nats-Msg-Id"]  # the same on every delivery of one message
        body = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            order = json.loads(body)
            item, quantity = str(order["item"]), int(order["quantity"])
        except (ValueError, KeyError, TypeError):
            return self.answer(422)  # never valid: dead-lettered now, reason "HTTP 422"
        if item not in STOCK:
            return self.answer(200, {"status": "DROP"})  # not sold here: dead-lettered now
        with lock:
            if key in handled:
                return self.answer(204)  # delivered again (at least once): done already
            if STOCK[item] < quantity:
                return self.answer(503, retry_after=2)  # not now: delivered again in 2 s
            STOCK[item] -= quantity
            handled.add(key)
        print(f"order {key}: {quantity} x {item}", flush=True)
        return self.answer(204)  # done: jsgw acks the message

    def answer(self, status: int, body: object = None, retry_after: int | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    port = int(os.environ.get("PORT", "3000"))
    ThreadingHTTPServer(("127.0.0.1", port), Orders).serve_forever()
